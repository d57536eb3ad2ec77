"""Accelerate's `accelerate.scheduler`: `AcceleratedScheduler`, the LR scheduler `prepare` returns (its stepping follows
the `scheduler_stepping` setting). The code is `acc.runtime.optim`. Importing this module imports torch.
"""

from acc.runtime.optim import AcceleratedScheduler

__all__ = ["AcceleratedScheduler"]
