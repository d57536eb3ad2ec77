"""acc: one PyTorch training loop on CPU, GPUs (DDP), FSDP, DeepSpeed, XLA and MPS.

Importing `acc` is cheap and torch-free; `Accelerator` and friends import torch when first touched.

Imports the contract (the names re-exported here), `acc.logging` and `acc.compat` (the lazy names, acc 0.1's
module paths); everything else is a lazy name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acc.compat import lazy_names, legacy_paths
from acc.contract.context import ProcessInfo, RunContext
from acc.contract.enums import DistributedType
from acc.contract.hookspecs import HOOKSPEC_VERSION, hookimpl
from acc.contract.kwargs import (
    AutocastKwargs,
    DataLoaderConfiguration,
    DistributedDataParallelKwargs,
    GradientAccumulationPlugin,
    GradScalerKwargs,
    InitProcessGroupKwargs,
)
from acc.contract.launch_plan import LaunchPlan, Rendezvous
from acc.contract.settings import Setting
from acc.contract.version import __accelerate_version__, __version__
from acc.errors import AccError, ConfigError, LaunchError, PluginError, ValidationError
from acc.logging import get_logger

_LAZY = {
    "Accelerator": ("acc.accelerator", "Accelerator"),
    "set_seed": ("acc.runtime.seeding", "set_seed"),
    "ProjectConfiguration": ("acc.checkpointing.files", "ProjectConfiguration"),
    "skip_first_batches": ("acc.runtime.data.loader", "skip_first_batches"),
    **{name: ("acc.state", name) for name in ("PartialState", "AcceleratorState", "GradientState")},
    **{name: ("acc.big_model", name) for name in ("init_empty_weights", "infer_auto_device_map", "dispatch_model",
                                              "load_checkpoint_and_dispatch", "cpu_offload", "disk_offload")},
    "init_on_device": ("acc.big_model", "init_on_device"),
    "load_checkpoint_in_model": ("acc.big_model", "load_checkpoint_in_model"),
    "cpu_offload_with_hook": ("acc.big_model", "cpu_offload_with_hook"),
    "find_executable_batch_size": ("acc.utils.memory", "find_executable_batch_size"),
    "is_rich_available": ("acc.utils.imports", "is_rich_available"),
    "DDPCommunicationHookType": ("acc.contract.enums", "DDPCommunicationHookType"),
    **{name: ("acc.launchers", name) for name in ("launch", "notebook_launcher", "debug_launcher", "WorkerFailedError")},
    "DeepSpeedPlugin": ("acc.compat.plugin_objects", "DeepSpeedPlugin"),
    "FullyShardedDataParallelPlugin": ("acc.compat.plugin_objects", "FullyShardedDataParallelPlugin"),
    "TorchDynamoPlugin": ("acc.compat.plugin_objects", "TorchDynamoPlugin"),
    "ProfileKwargs": ("acc.compat.plugin_objects", "ProfileKwargs"),
    "prepare_pippy": ("acc.inference", "prepare_pippy"),
    "ParallelismConfig": ("acc.parallelism_config", "ParallelismConfig"),
}

if TYPE_CHECKING:  # pragma: no cover
    from acc.accelerator import Accelerator
    from acc.runtime.seeding import set_seed


legacy_paths.install()


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return lazy_names.resolve(globals(), _LAZY, name)
    moved = legacy_paths.module(f"acc.{name}")
    if moved is not None:
        return moved
    raise AttributeError(f"module 'acc' has no attribute {name!r}")


__all__ = [
    "AutocastKwargs", "DataLoaderConfiguration", "DistributedDataParallelKwargs", "GradientAccumulationPlugin",
    "GradScalerKwargs", "InitProcessGroupKwargs",
    "AccError", "Accelerator", "AcceleratorState", "DistributedType", "GradientState", "PartialState", "ConfigError", "HOOKSPEC_VERSION", "LaunchError", "LaunchPlan", "PluginError",
    "ProcessInfo", "ProjectConfiguration", "Rendezvous", "RunContext", "Setting", "ValidationError", "__accelerate_version__", "__version__", "get_logger", "hookimpl", "set_seed",
    "DDPCommunicationHookType", "cpu_offload_with_hook", "find_executable_batch_size", "init_on_device",
    "is_rich_available", "load_checkpoint_in_model",
    "WorkerFailedError", "debug_launcher", "launch", "notebook_launcher",
    "DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "ProfileKwargs", "TorchDynamoPlugin", "prepare_pippy",
    "ParallelismConfig",
]
