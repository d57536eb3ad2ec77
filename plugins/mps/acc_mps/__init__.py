"""acc-mps: the Apple Silicon GPU (MPS) backend for acc (entry point `mps` in `acc.backends`)."""

__version__ = "0.1.0"
