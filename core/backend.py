"""acc's backend SDK: everything a backend (a plugin in the entry-point group `acc.backends`) may use.

A backend imports this module and nothing else of acc (the rest of the kernel is internal and may change in
any release; a test holds acc's own backends to it). Importing it is torch-free; the names that need torch
(process groups, tensor files) import it when first touched.

Contract (version 2, `HOOKSPEC_VERSION`): hook specs in `acc.contract.hookspecs` (read them: each says when it is
called, on which ranks, and what the default does), implemented with `@hookimpl`; the collectives as one
`Communicator` (`acc_communicator`); promises as `Capabilities` (`acc_capabilities`).

Context types: `RunContext` (per run: `settings`, `process`, `loop`, `backend_state` your scratch space,
`backend_config` the configuration you run with, published for scripts (DeepSpeed's config),
`dataloaders`, `handler(cls)` for the user's kwargs handlers), `ProcessInfo` (what `acc_setup` returns),
`LoopState` (`sync_gradients`, `step` = applied optimizer steps, `micro_step`, `end_of_dataloader`, `remainder`).

Settings: declare yours in `acc_add_settings(registry)` with `registry.add(Setting(...))`. Names are one
namespace shared with the kernel and every other plugin; `Setting(..., scoped=True)` makes a name your own:
`Setting("sync_every", int, 4, ..., scoped=True)` in plugin `localsgd` is `[localsgd] sync_every` in config
files, `--localsgd-sync-every`, `ACC_LOCALSGD_SYNC_EVERY`, and `settings["localsgd.sync_every"]` (or
`settings.of("localsgd")["sync_every"]`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acc.assembly.hardware import (
    OVERRIDE_ENV,
    PCI_DEVICES,
    is_apple_silicon,
    overridden,
    tpu_devices,
    visible_cuda_devices,
)
from acc.assembly.plugins import module_available
from acc.contract.capabilities import COMPILE_MODELS, STATE_MODELS, SYNC_MODELS, Capabilities
from acc.contract.communicator import COLLECTIVES, REDUCE_OPS, Communicator, LocalCommunicator
from acc.contract.context import LoopState, ProcessInfo, RunContext
from acc.contract.detection import Detection
from acc.contract.enums import DistributedType
from acc.contract.hookspecs import HOOKSPEC_VERSION, hookimpl
from acc.contract.kwargs import (
    AutocastKwargs,
    DistributedDataParallelKwargs,
    GradScalerKwargs,
    InitProcessGroupKwargs,
    KwargsHandler,
)
from acc.contract.launch_plan import LaunchPlan, Rendezvous
from acc.contract.settings import ResolvedSettings, Setting
from acc.contract.sharded_build import ShardedBuild, dim0_split, flat_split
from acc.errors import AccError, CheckpointError, ConfigError, ValidationError
from acc.launcher.plans import elastic_plan
from acc.runtime.communicators import TorchDistributed
from acc.runtime.placeholders import DummyOptim, DummyScheduler, scheduler_for

# name -> (module under acc, attribute): imported (with torch) when first touched
_LAZY = {
    # torch.distributed process groups, for backends built on them
    "init_process_group": ("acc.runtime.distributed", "init_process_group"),
    "destroy_process_group": ("acc.runtime.distributed", "destroy_process_group"),
    "launcher_facts": ("acc.runtime.distributed", "launcher_facts"),
    "choose_device": ("acc.runtime.distributed", "choose_device"),
    # all-gather and reduce-scatter as isend/irecv with each peer (faster than gloo's own)
    "p2p_all_gather_into": ("acc.runtime.distributed", "p2p_all_gather_into"),
    "p2p_reduce_scatter_sum": ("acc.runtime.distributed", "p2p_reduce_scatter_sum"),
    # checkpoint files: tensors as safetensors, everything else read with weights_only; verify before reading
    "save_tensors": ("acc.checkpointing.files", "save_tensors"),
    "load_tensors": ("acc.checkpointing.files", "load_tensors"),
    "save_object": ("acc.checkpointing.files", "save_object"),
    "load_object": ("acc.checkpointing.files", "load_object"),
    "verify": ("acc.checkpointing.files", "verify"),
    # sharded tensors written per rank, readable on any number of ranks
    "save_pieces": ("acc.checkpointing.pieces", "save_pieces"),
    "ShardedReader": ("acc.checkpointing.pieces", "ShardedReader"),
    "model_prefix": ("acc.checkpointing.pieces", "model_prefix"),
    # nested structures of tensors
    "apply": ("acc.runtime.ops", "apply"),
    # models built sharded (acc_init_module): the meta-device build (the interface and splits are imported above)
    "MetaBuild": ("acc.runtime.init_module", "MetaBuild"),
    # torch.compile for a backend declaring Capabilities(compile="backend"): its units compiled in place
    "compile_units": ("acc.runtime.compiling", "compile_units"),
    # the run's device mesh (Accelerator(parallelism_config=...)) and tensor parallelism on its tp dim
    "run_mesh": ("acc.runtime.parallelism", "run_mesh"),
    "apply_tensor_parallel": ("acc.runtime.tensor_parallel", "apply_tensor_parallel"),
}

if TYPE_CHECKING:  # pragma: no cover
    from acc.checkpointing.files import load_object, load_tensors, save_object, save_tensors, verify
    from acc.checkpointing.pieces import ShardedReader, model_prefix, save_pieces
    from acc.runtime.compiling import compile_units
    from acc.runtime.distributed import (
        choose_device,
        destroy_process_group,
        init_process_group,
        launcher_facts,
        p2p_all_gather_into,
        p2p_reduce_scatter_sum,
    )
    from acc.runtime.init_module import MetaBuild
    from acc.runtime.ops import apply
    from acc.runtime.parallelism import run_mesh
    from acc.runtime.tensor_parallel import apply_tensor_parallel


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from acc.compat import lazy_names

        return lazy_names.resolve(globals(), _LAZY, name)
    raise AttributeError(f"module 'acc.backend' has no attribute {name!r}; the SDK's names are listed in "
                         "acc.backend.__all__ (and docs/reference/backend-sdk.md)")


def saved_world_size(manifest: dict[str, Any]) -> int | None:
    """The number of processes that wrote the checkpoint whose manifest this is (None when unknown): what a
    backend compares with `ctx.num_processes` before loading per-rank state."""
    value = manifest.get("run", {}).get("processes", {}).get("num_processes")
    return int(value) if value is not None else None


def collectives_choice(setting: str, process_group_backend: str | None, *, p2p_fits: bool = True) -> str:
    """What a backend's collectives setting (`auto`, `native`, `p2p` or its own names) picks: `auto` is p2p on gloo,
    where `p2p_all_gather_into`/`p2p_reduce_scatter_sum` beat gloo's own, if the backend's layout suits them
    (`p2p_fits`; fsdp's hybrid_shard does not), and native otherwise; any other value is itself."""
    if setting != "auto":
        return setting
    return "p2p" if process_group_backend == "gloo" and p2p_fits else "native"


def device_problems(settings: ResolvedSettings, backend: str) -> list[str]:
    """The kernel's shared checks of a one-process-per-device backend's settings: more processes than visible
    CUDA devices, nccl without CUDA. A backend returns these from its `acc_validate` (with its own)."""
    problems = []
    cuda = visible_cuda_devices()
    if cuda and not settings["cpu"] and settings["nproc"] > cuda:
        problems.append(f"nproc = {settings['nproc']} (from {settings.source('nproc')}) but only {cuda} CUDA "
                        f"device(s) are visible; {backend} runs one process per device: use --nproc {cuda}, or --cpu "
                        "for CPU processes")
    pg = settings.get("process_group_backend")
    if pg == "nccl" and (cuda == 0 or settings["cpu"]):
        problems.append("process_group_backend 'nccl' needs CUDA devices, but "
                        + ("--cpu is set" if settings["cpu"] else "none is visible")
                        + f" (from {settings.source('process_group_backend')}); use gloo or auto")
    return problems


__all__ = [
    "COLLECTIVES", "COMPILE_MODELS", "HOOKSPEC_VERSION", "OVERRIDE_ENV", "PCI_DEVICES", "REDUCE_OPS", "STATE_MODELS", "SYNC_MODELS",
    "AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler",
    "DummyOptim", "DummyScheduler", "scheduler_for",
    "AccError", "Capabilities", "CheckpointError", "Communicator", "ConfigError", "Detection", "DistributedType",
    "LaunchPlan", "LocalCommunicator", "LoopState", "ProcessInfo", "Rendezvous", "ResolvedSettings", "RunContext",
    "MetaBuild", "Setting", "ShardedBuild", "ShardedReader", "TorchDistributed", "ValidationError",
    "dim0_split", "flat_split",
    "apply", "apply_tensor_parallel", "choose_device", "collectives_choice", "compile_units", "destroy_process_group", "device_problems",
    "elastic_plan", "hookimpl",
    "init_process_group", "is_apple_silicon", "launcher_facts", "overridden", "load_object", "load_tensors", "model_prefix",
    "module_available", "p2p_all_gather_into", "p2p_reduce_scatter_sum", "run_mesh",
    "save_object", "save_pieces", "save_tensors", "saved_world_size", "tpu_devices", "verify",
    "visible_cuda_devices",
]
