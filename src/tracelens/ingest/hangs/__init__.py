"""What a hung job leaves: Flight Recorder dumps (pickles read with `safe_pickle`), the text of
PyTorch's Flight Recorder analyzer, and the ranks' stack dumps."""
