"""PyTorch profiler traces (Kineto's Chrome-trace JSON)."""
