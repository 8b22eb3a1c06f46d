"""Packet captures (pcap, pcapng): the format's reader; the record walk and the decoding are in
tracelens.capture_decoder, outside ingest so that the walk's child process loads no polars."""
