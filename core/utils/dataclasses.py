"""The kwargs handlers and enumerations under Accelerate's module path `accelerate.utils.dataclasses`
(acc's own objects: `acc.kwargs`, `acc.enums`). Torch-free."""

from __future__ import annotations

from typing import Any

from ..enums import (
    BaseEnum,
    ComputeEnvironment,
    DDPCommunicationHookType,
    DynamoBackend,
    EnumWithContains,
    LoggerType,
    PrecisionType,
    RNGType,
)
from ..kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)

_LAZY = {"ProjectConfiguration": ("checkpoint", "ProjectConfiguration")}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from .. import _resolve_lazy

        return _resolve_lazy(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.utils.dataclasses' has no attribute {name!r}")


__all__ = ["AutocastKwargs", "BaseEnum", "ComputeEnvironment", "DDPCommunicationHookType",
           "DistributedDataParallelKwargs", "DynamoBackend", "EnumWithContains", "GradScalerKwargs",
           "InitProcessGroupKwargs", "KwargsHandler", "LoggerType", "PrecisionType", "ProjectConfiguration",
           "RNGType"]
