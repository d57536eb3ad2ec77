"""What a backend promises about training, declared through `acc_capabilities` (torch-free).

The conformance kit, `acc check` and `acc launch --dry-run` read these promises and hold the backend to them: a
backend that synchronises every step must give every rank identical weights after each step and match a
one-process run with N times the batch; one that synchronises every k steps must make the replicas agree at
each k-th step; one whose state is sharded must save each rank's part and load it back on that rank.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

SYNC_MODELS = ("every_step", "periodic", "none")
STATE_MODELS = ("replicated", "sharded")
COMPILE_MODELS = ("model", "backend")
MESH_DIMS = ("dp_replicate", "dp_shard", "tp", "cp", "sp")  # Accelerate's ParallelismConfig dimensions


@dataclass(frozen=True)
class Capabilities:
    """A backend's promises.

    `sync`: "every_step" (gradients are averaged on every optimizer step: replicas stay identical), "periodic"
    (replicas train apart and are averaged every `sync_period` optimizer steps) or "none" (one process).
    `state`: "replicated" (every rank holds the whole model and optimizer state) or "sharded" (each rank holds a
    part, saved and loaded per rank). `reshard`: its checkpoints load on another number of processes.
    `distributed_type`: Accelerate's DistributedType value it runs as (e.g. "MULTI_CPU", "FSDP").
    `mixed_precision`: the modes it runs. `local_micro_steps`: accumulation micro-steps (no sync) run no gradient
    collective (False for backends whose gradients are partitioned, e.g. ZeRO-2/3, which reduce every micro-step).
    `compile`: how prepared models are compiled when the run asks for torch.compile (dynamo_backend): "model"
    (the kernel compiles the wrapped model whole) or "backend" (the backend compiles its own units in place inside
    acc_wrap, through `acc.backend.compile_units`; the kernel leaves the model as acc_wrap returned it).
    `mesh_dims`: the ParallelismConfig dimensions it drives (`Accelerator(parallelism_config=...)` may give a size
    above 1 only to these): "dp_replicate" (whole replicas, as DDP), "dp_shard" (sharded data parallel, as FSDP or
    ZeRO), "tp", "cp", "sp". `notes`: anything the dry run should show.
    """

    sync: str = "every_step"
    sync_period: int | None = None
    state: str = "replicated"
    reshard: bool = True
    distributed_type: Any = "NO"
    mixed_precision: tuple[str, ...] = ("no", "fp16", "bf16")
    local_micro_steps: bool = True
    compile: str = "model"
    notes: tuple[str, ...] = field(default_factory=tuple)
    mesh_dims: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.sync not in SYNC_MODELS:
            raise ValueError(f"Capabilities(sync={self.sync!r}): one of {', '.join(SYNC_MODELS)}")
        if self.state not in STATE_MODELS:
            raise ValueError(f"Capabilities(state={self.state!r}): one of {', '.join(STATE_MODELS)}")
        if self.compile not in COMPILE_MODELS:
            raise ValueError(f"Capabilities(compile={self.compile!r}): one of {', '.join(COMPILE_MODELS)}")
        unknown = [d for d in self.mesh_dims if d not in MESH_DIMS]
        if unknown:
            raise ValueError(f"Capabilities(mesh_dims={self.mesh_dims!r}): {unknown} not among {', '.join(MESH_DIMS)}")
        if self.sync == "periodic" and not (isinstance(self.sync_period, int) and self.sync_period >= 1):
            raise ValueError(f"Capabilities(sync='periodic') needs sync_period >= 1, got {self.sync_period!r}")

    def synchronises_at(self, step: int) -> bool:
        """Whether replicas agree after optimizer step `step` (1-based) under these promises."""
        if self.sync == "every_step":
            return True
        if self.sync == "periodic":
            return step % int(self.sync_period or 1) == 0
        return False

    def describe(self) -> str:
        sync = {"every_step": "gradients every step", "none": "none (one process)"}.get(
            self.sync, f"parameters every {self.sync_period} steps")
        return (f"sync {sync}; {self.state} state; checkpoints load on "
                f"{'any' if self.reshard else 'the same'} process count; runs as {getattr(self.distributed_type, 'value', self.distributed_type)}; "
                f"precision {'/'.join(self.mixed_precision)}"
                + ("" if self.local_micro_steps else "; gradients reduced on every micro-step")
                + ("" if self.compile == "model" else "; torch.compile per unit, by the backend")
                + (f"; drives mesh dims {', '.join(self.mesh_dims)}" if self.mesh_dims else ""))


__all__ = ["COMPILE_MODELS", "Capabilities", "MESH_DIMS", "STATE_MODELS", "SYNC_MODELS"]
