"""Accelerate's `accelerate.optimizer`: `AcceleratedOptimizer`, the optimizer `prepare` returns (it steps only on real
optimizer steps and reports `step_was_skipped`). The code is `acc.runtime.optim`. Importing this module imports torch.
"""

from acc.runtime.optim import AcceleratedOptimizer

__all__ = ["AcceleratedOptimizer"]
