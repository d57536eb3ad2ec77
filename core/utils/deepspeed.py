"""Accelerate's `accelerate.utils.deepspeed` names: the placeholders `DummyOptim` and `DummyScheduler` (acc's own
objects, `acc.runtime.placeholders`). Torch-free."""

from acc.runtime.placeholders import DummyOptim, DummyScheduler, check_prepare

__all__ = ["DummyOptim", "DummyScheduler", "check_prepare"]
