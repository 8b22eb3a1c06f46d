"""DeepSpeed: its training logs (`log`, a line parser of the text-log pass; `grammar`, the kinds
of message bodies; `assemble`, a file's records into tables) and `ds_config.json` (`ds_config`)."""
