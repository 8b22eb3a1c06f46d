"""NCCL's own output: NCCL_DEBUG lines and PyTorch's ProcessGroupNCCL messages (`log`, a line
parser of the text-log pass). nccl-tests results are host evidence (`ingest.host.nccl_tests`)."""
