"""Packet captures (pcap, pcapng); the record walk and the decoding are in tracelens.packets."""
