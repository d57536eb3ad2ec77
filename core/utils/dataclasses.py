"""The kwargs handlers, plugin objects and enumerations under Accelerate's module path
`accelerate.utils.dataclasses` (acc's own objects: `acc.contract.kwargs`, `acc.compat.plugin_objects`, `acc.contract.enums`).
Torch-free."""

from __future__ import annotations

from typing import Any

from acc.contract.enums import (
    BaseEnum,
    ComputeEnvironment,
    DDPCommunicationHookType,
    DynamoBackend,
    EnumWithContains,
    LoggerType,
    PrecisionType,
    RNGType,
)
from acc.contract.kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)

_LAZY = {
    "ProjectConfiguration": ("acc.checkpointing.files", "ProjectConfiguration"),
    "DeepSpeedPlugin": ("acc.compat.plugin_objects", "DeepSpeedPlugin"),
    "FullyShardedDataParallelPlugin": ("acc.compat.plugin_objects", "FullyShardedDataParallelPlugin"),
    "TorchDynamoPlugin": ("acc.compat.plugin_objects", "TorchDynamoPlugin"),
    "ProfileKwargs": ("acc.compat.plugin_objects", "ProfileKwargs"),
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from acc.compat import lazy_names

        return lazy_names.resolve(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.utils.dataclasses' has no attribute {name!r}")


__all__ = ["AutocastKwargs", "BaseEnum", "ComputeEnvironment", "DDPCommunicationHookType", "DeepSpeedPlugin",
           "DistributedDataParallelKwargs", "DynamoBackend", "EnumWithContains", "FullyShardedDataParallelPlugin",
           "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler", "LoggerType", "PrecisionType",
           "ProfileKwargs", "ProjectConfiguration", "RNGType", "TorchDynamoPlugin"]
