"""tracelens: find out why a distributed training run was slow or hung, offline."""

__version__ = "0.1.0"  # the one place: pyproject.toml reads it from here
