"""Host evidence: GPU samples (nvidia-smi, dcgmi), kernel logs, interface listings, and the results
of nccl-tests and perftest; `hostlines` holds what they share."""
