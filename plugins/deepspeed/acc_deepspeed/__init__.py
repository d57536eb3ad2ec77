"""acc-deepspeed: the DeepSpeed ZeRO backend for acc (entry point `deepspeed` in `acc.backends`)."""

__version__ = "0.1.0"
