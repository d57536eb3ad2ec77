"""Per-run state handed to worker-side hooks. Nothing here is global: one `RunContext` per `Accelerator`."""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any, Iterator

from acc.contract.settings import ResolvedSettings


@dataclass
class ProcessInfo:
    """What `acc_setup` reports about this process: where it computes and where it sits in the world."""

    device: Any  # a torch.device
    num_processes: int = 1
    process_index: int = 0
    local_process_index: int = 0
    local_num_processes: int = 1
    distributed_type: Any = "NO"  # Accelerate's DistributedType (or its value, e.g. "MULTI_CPU"; a label of one's own)
    native_precision: bool = False  # True: the backend implements mixed precision itself (kernel stands aside)
    process_group_backend: str | None = None  # the torch.distributed backend ("gloo", "nccl"), if it uses one

    def __post_init__(self) -> None:
        if not 0 <= self.process_index < self.num_processes:
            raise ValueError(f"process_index {self.process_index} outside a world of {self.num_processes}")
        if not 0 <= self.local_process_index < self.local_num_processes:
            raise ValueError(
                f"local_process_index {self.local_process_index} outside {self.local_num_processes} local processes"
            )


@dataclass
class LoopState:
    """Training-loop facts the kernel keeps and backends may read (e.g. whether this micro-step syncs)."""

    sync_gradients: bool = True
    step: int = 0  # applied optimizer steps (a step skipped by the fp16 scaler does not count)
    micro_step: int = 0  # Accelerate's `accelerator.step`: micro-steps since the last end of the data
    active_loaders: "LiveObjects" = field(default_factory=lambda: LiveObjects())  # innermost last, held weakly

    @property
    def active_loader(self) -> Any:
        return self.active_loaders[-1] if self.active_loaders else None

    @property
    def end_of_dataloader(self) -> bool:
        loader = self.active_loader
        return bool(loader is not None and loader.end_of_dataloader)

    @property
    def remainder(self) -> int:
        """Real samples in the last global batch of the active loader's pass (-1: unknown or no loader)."""
        loader = self.active_loader
        return getattr(loader, "remainder", -1) if loader is not None else -1


class LiveObjects:
    """A list of objects held weakly: what is no longer referenced elsewhere drops out (a prepared loader the
    script let go of is freed, the run does not keep it alive). Iterating, indexing and `len` see live ones only."""

    def __init__(self) -> None:
        self._refs: list[weakref.ref[Any]] = []

    def _live(self) -> list[Any]:
        objects = [r() for r in self._refs]
        self._refs = [r for r, o in zip(self._refs, objects) if o is not None]
        return [o for o in objects if o is not None]

    def append(self, obj: Any) -> None:
        self._refs.append(weakref.ref(obj))

    def remove(self, obj: Any) -> None:
        """Take out the last reference to `obj` (ValueError when it is not held)."""
        for i in range(len(self._refs) - 1, -1, -1):
            if self._refs[i]() is obj:
                del self._refs[i]
                return
        raise ValueError(f"{obj!r} is not held")

    def clear(self) -> None:
        self._refs.clear()

    def __contains__(self, obj: Any) -> bool:
        return any(r() is obj for r in self._refs)

    def __iter__(self) -> Iterator[Any]:
        return iter(self._live())

    def __len__(self) -> int:
        return len(self._live())

    def __getitem__(self, index: int) -> Any:
        return self._live()[index]

    def __bool__(self) -> bool:
        return bool(self._live())

    def __reduce__(self) -> tuple[type, tuple[()]]:  # weak references do not travel: a copy starts empty
        return (type(self), ())


@dataclass
class RunContext:
    """Handed to every worker-side hook.

    `settings` are the resolved settings; `process` is filled from `acc_setup`'s answer and `communicator` from
    `acc_communicator`'s; `backend_config` is what the backend runs with, published for scripts (DeepSpeed's
    config); `backend_state` is the chosen backend's private scratch space (the kernel never reads
    or writes it); `loop` holds the training-loop facts (`sync_gradients`, `step`, `micro_step`,
    `end_of_dataloader`, `remainder`); `dataloaders` are the prepared loaders (a backend may need the
    per-process batch size: `ctx.dataloaders[0].per_process_batch_size`).
    """

    settings: ResolvedSettings
    backend: str
    process: ProcessInfo | None = None
    loop: LoopState = field(default_factory=LoopState)
    backend_state: dict[str, Any] = field(default_factory=dict)
    kwargs_handlers: list[Any] = field(default_factory=list)
    dataloaders: LiveObjects = field(default_factory=LiveObjects)  # the prepared loaders, in prepare order (weakly)
    plugin_state: dict[str, Any] = field(default_factory=dict)  # cross-cutting plugins' state, by plugin name
    communicator: Any = None  # the backend's Communicator (set right after acc_setup)
    # what the backend runs with, for scripts to read (the kernel shows it, e.g. DeepSpeed's config as Accelerate's
    # `AcceleratorState().deepspeed_plugin.deepspeed_config`); written by the backend only
    backend_config: dict[str, Any] = field(default_factory=dict)
    # the run's ParallelismConfig, checked against the backend's Capabilities.mesh_dims (None without one);
    # `acc.backend.run_mesh(ctx)` is its DeviceMesh
    parallelism: Any = None

    def handler(self, cls: type) -> Any:
        """The user's kwargs handler of type `cls` (e.g. DistributedDataParallelKwargs), or None."""
        for h in self.kwargs_handlers:
            if isinstance(h, cls):
                return h
        return None

    @property
    def device(self) -> Any:
        return self.process.device if self.process else None

    @property
    def num_processes(self) -> int:
        return self.process.num_processes if self.process else 1

    @property
    def process_index(self) -> int:
        return self.process.process_index if self.process else 0

    @property
    def local_process_index(self) -> int:
        return self.process.local_process_index if self.process else 0
