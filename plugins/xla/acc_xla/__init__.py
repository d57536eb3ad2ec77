"""acc-xla: the PyTorch/XLA (PJRT) backend for acc (entry point `xla` in `acc.backends`)."""

__version__ = "0.1.0"
