"""Kwargs handlers: typed bundles of keyword arguments a user passes through `Accelerator(kwargs_handlers=[...])`
to the object a backend builds (names as in Hugging Face Accelerate). Torch-free dataclasses."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any


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
