"""acc-fsdp: the fully-sharded data-parallel backend for acc (entry point `fsdp` in `acc.backends`)."""

__version__ = "0.1.0"
