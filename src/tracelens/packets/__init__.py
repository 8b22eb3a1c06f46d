"""Reading packet captures: the record stream (records), its walk in a process of its own
(walker), byte gathering (gather) and the vectorized decoder (decode). Flow analysis of the
decoded packets is derived (tracelens.derived.flows).
"""
