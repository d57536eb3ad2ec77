"""acc: one PyTorch training loop on CPU, GPUs (DDP), FSDP, DeepSpeed, XLA and MPS.

Importing `acc` is cheap and torch-free; `Accelerator` and friends import torch when first touched.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._version import __version__
from .errors import AccError, ConfigError, LaunchError, PluginError, ValidationError
from .enums import DistributedType
from .hookspecs import HOOKSPEC_VERSION, hookimpl
from .kwargs import (AutocastKwargs, DataLoaderConfiguration, DistributedDataParallelKwargs, GradientAccumulationPlugin,
                     GradScalerKwargs, InitProcessGroupKwargs)
from .launch.plan import LaunchPlan, Rendezvous
from .logging import get_logger
from .context import ProcessInfo, RunContext
from .settings import Setting

_LAZY = {
    "Accelerator": ("accelerator", "Accelerator"),
    "set_seed": ("seed", "set_seed"),
    "ProjectConfiguration": ("checkpoint", "ProjectConfiguration"),
    "skip_first_batches": ("data", "skip_first_batches"),
    **{name: ("state", name) for name in ("PartialState", "AcceleratorState", "GradientState")},
    **{name: ("big_model", name) for name in ("init_empty_weights", "infer_auto_device_map", "dispatch_model",
                                              "load_checkpoint_and_dispatch", "cpu_offload", "disk_offload")},
    "init_on_device": ("big_model", "init_on_device"),
    "load_checkpoint_in_model": ("big_model", "load_checkpoint_in_model"),
    "cpu_offload_with_hook": ("big_model", "cpu_offload_with_hook"),
    "find_executable_batch_size": ("utils.memory", "find_executable_batch_size"),
    "is_rich_available": ("utils.imports", "is_rich_available"),
    "DDPCommunicationHookType": ("enums", "DDPCommunicationHookType"),
    **{name: ("launchers", name) for name in ("notebook_launcher", "debug_launcher", "WorkerFailedError")},
    "DeepSpeedPlugin": ("plugin_dataclasses", "DeepSpeedPlugin"),
    "FullyShardedDataParallelPlugin": ("plugin_dataclasses", "FullyShardedDataParallelPlugin"),
    "TorchDynamoPlugin": ("plugin_dataclasses", "TorchDynamoPlugin"),
    "ProfileKwargs": ("plugin_dataclasses", "ProfileKwargs"),
}

if TYPE_CHECKING:  # pragma: no cover
    from .accelerator import Accelerator
    from .seed import set_seed


def _resolve_lazy(namespace: dict[str, Any], table: dict[str, tuple[str, str]], name: str) -> Any:
    """Import `acc.<module>.<attr>` for `table[name]` and cache it in `namespace` (a module's globals)."""
    import importlib

    module, attr = table[name]
    value = getattr(importlib.import_module(f"acc.{module}"), attr)
    namespace[name] = value
    return value


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return _resolve_lazy(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc' has no attribute {name!r}")


__all__ = [
    "AutocastKwargs", "DataLoaderConfiguration", "DistributedDataParallelKwargs", "GradientAccumulationPlugin",
    "GradScalerKwargs", "InitProcessGroupKwargs",
    "AccError", "Accelerator", "AcceleratorState", "DistributedType", "GradientState", "PartialState", "ConfigError", "HOOKSPEC_VERSION", "LaunchError", "LaunchPlan", "PluginError",
    "ProcessInfo", "ProjectConfiguration", "Rendezvous", "RunContext", "Setting", "ValidationError", "__version__", "get_logger", "hookimpl", "set_seed",
    "DDPCommunicationHookType", "cpu_offload_with_hook", "find_executable_batch_size", "init_on_device",
    "is_rich_available", "load_checkpoint_in_model",
    "WorkerFailedError", "debug_launcher", "launch", "notebook_launcher",
    "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "ProfileKwargs", "TorchDynamoPlugin",
]
