"""acc-ddp: the DistributedDataParallel backend for acc (entry point `ddp` in `acc.backends`)."""

__version__ = "0.1.0"
