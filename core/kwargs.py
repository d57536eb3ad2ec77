"""Kwargs handlers: typed bundles of keyword arguments a user passes through `Accelerator(kwargs_handlers=[...])`
to the object a backend builds (names as in Hugging Face Accelerate). Torch-free dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any

from .enums import DDPCommunicationHookType


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
    comm_state_option: dict = field(default_factory=dict)

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
        hook = hooks[hook_type]
        if wrapper_type in wrappers:
            hook = wrappers[wrapper_type](hook)
        power_sgd = hook_type in (DDPCommunicationHookType.POWER_SGD, DDPCommunicationHookType.BATCHED_POWER_SGD)
        state = powerSGD_hook.PowerSGDState(None, **self.comm_state_option) if power_sgd else None
        model.register_comm_hook(state=state, hook=hook)


@dataclass
class InitProcessGroupKwargs(KwargsHandler):
    """Process-group backend ("gloo", "nccl", ...) and timeout in seconds, overriding the settings."""

    backend: str | None = None
    timeout: float | None = None


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
