"""Packet captures: the record stream (records), the vectorized decoder (decode),
per-QP and per-TCP-flow analysis (flows) and the address-to-host map (hosts).
"""
