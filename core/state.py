"""Accelerate's `accelerate.state`: `PartialState`, `AcceleratorState`, `GradientState`, `is_initialized` (views of
the process's run, `acc.runtime.states`)."""

from acc.contract.enums import DistributedType
from acc.runtime.states import AcceleratorState, GradientState, PartialState, is_initialized

__all__ = ["AcceleratorState", "DistributedType", "GradientState", "PartialState", "is_initialized"]
