"""Kwargs handlers: typed bundles of keyword arguments a user passes through `Accelerator(kwargs_handlers=[...])`
to the object a backend builds (names as in Hugging Face Accelerate). Torch-free dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from acc.contract.enums import DDPCommunicationHookType


class KwargsHandler:
    """Base: `to_kwargs()` gives the fields that differ from their defaults."""

    def to_kwargs(self) -> dict[str, Any]:
        default = type(self)()
        return {f.name: getattr(self, f.name) for f in fields(self)  # type: ignore[arg-type]
                if getattr(self, f.name) != getattr(default, f.name)}


@dataclass
class DistributedDataParallelKwargs(KwargsHandler):
    """Arguments for `torch.nn.parallel.DistributedDataParallel`."""

    dim: int = 0
    broadcast_buffers: bool = True
    bucket_cap_mb: float = 25
    find_unused_parameters: bool = False
    check_reduction: bool = False
    gradient_as_bucket_view: bool = False
    static_graph: bool = False
    # a communication hook the ddp backend registers on the wrapped model (not DDP constructor arguments):
    # `comm_hook` fp16/bf16 compression or (batched) PowerSGD, `comm_wrapper` fp16/bf16 compression around
    # PowerSGD, `comm_state_option` the PowerSGDState arguments (e.g. matrix_approximation_rank)
    comm_hook: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_wrapper: DDPCommunicationHookType = DDPCommunicationHookType.NO
    comm_state_option: dict[str, Any] = field(default_factory=dict)

    def to_kwargs(self) -> dict[str, Any]:
        """The DDP constructor arguments that differ from their defaults (the comm_* fields are not among them)."""
        return {k: v for k, v in super().to_kwargs().items() if not k.startswith("comm_")}

    def register_comm_hook(self, model: Any) -> None:
        """Register the chosen communication hook on `model` (a DistributedDataParallel); nothing for "no"."""
        hook_type = DDPCommunicationHookType(self.comm_hook)
        wrapper_type = DDPCommunicationHookType(self.comm_wrapper)
        if hook_type is DDPCommunicationHookType.NO:
            return
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

        hooks = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_hook,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_hook,
            DDPCommunicationHookType.POWER_SGD: powerSGD_hook.powerSGD_hook,
            DDPCommunicationHookType.BATCHED_POWER_SGD: powerSGD_hook.batched_powerSGD_hook,
        }
        wrappers = {
            DDPCommunicationHookType.FP16: default_hooks.fp16_compress_wrapper,
            DDPCommunicationHookType.BF16: default_hooks.bf16_compress_wrapper,
        }
        if wrapper_type is not DDPCommunicationHookType.NO and wrapper_type not in wrappers:
            raise ValueError(f"comm_wrapper={wrapper_type.value!r}: use 'no', 'fp16' or 'bf16'")
        hook: Any = hooks[hook_type]
        if wrapper_type in wrappers:
            hook = wrappers[wrapper_type](hook)
        power_sgd = hook_type in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
        state = powerSGD_hook.PowerSGDState(None, **self.comm_state_option) if power_sgd else None
        model.register_comm_hook(state=state, hook=hook)


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """The process group's backend ("gloo", "nccl", ...; None: the run's choice), `init_method` and `timeout`
    (a `datetime.timedelta`, as in Accelerate, or seconds), overriding the launch settings on every backend."""

    backend: str | None = None
    init_method: str | None = None
    timeout: Any = None

    def timeout_seconds(self) -> float | None:
        """The timeout in seconds, or None when not given."""
        if self.timeout is None:
            return None
        seconds = self.timeout.total_seconds() if hasattr(self.timeout, "total_seconds") else float(self.timeout)
        if seconds <= 0:
            raise ValueError(f"InitProcessGroupKwargs(timeout={self.timeout!r}): the timeout must be positive")
        return seconds


@dataclass
class GradScalerKwargs(KwargsHandler):
    """Arguments for `torch.amp.GradScaler` (fp16)."""

    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    enabled: bool = True


@dataclass
class AutocastKwargs(KwargsHandler):
    """`enabled` and `cache_enabled` for `torch.autocast`; `outputs_float32=False` keeps model outputs in
    the autocast dtype instead of converting them to float32."""

    enabled: bool = True
    cache_enabled: bool | None = None
    outputs_float32: bool = True


@dataclass
class DataLoaderConfiguration:
    """How `prepare` shares data loaders among processes (Accelerate's fields and defaults).

    `split_batches`: cut each batch into one piece per process instead of giving each process whole batches.
    `dispatch_batches`: the main process reads the data and sends each process its part (None: for iterable
    datasets). `even_batches`: complete the last round so every process takes the same number of steps.
    `use_seedable_sampler`/`data_seed`: shuffle epoch e with `data_seed + e`. `non_blocking`: asynchronous
    device copies. `use_stateful_dataloader`: `load_state` continues each loader where the checkpoint stopped
    (acc's exact resume, the `resume_data_position` setting; no torchdata needed).
    """

    split_batches: bool = False
    dispatch_batches: bool | None = None
    even_batches: bool = True
    use_seedable_sampler: bool = False
    data_seed: int | None = None
    non_blocking: bool = False
    use_stateful_dataloader: bool = False


@dataclass
class GradientAccumulationPlugin(KwargsHandler):
    """Gradient accumulation (Accelerate's fields): `num_steps` micro-steps per optimizer step; `adjust_scheduler`
    counts micro-steps in the scheduler's step count; `sync_with_dataloader` ends an accumulation at the end of
    the data; `sync_each_batch` synchronises gradients on every micro-step (more communication, less memory)."""

    num_steps: int | None = None
    adjust_scheduler: bool = True
    sync_with_dataloader: bool = True
    sync_each_batch: bool = False
