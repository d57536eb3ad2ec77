"""The containers a model may sit in (DistributedDataParallel, DataParallel, a DeepSpeed engine, FSDP1) and
torch.compile's wrapper: what `Accelerator.unwrap_model` and `acc.utils.extract_model_from_parallel` take off.
torch (and deepspeed, when it was imported) are imported inside the functions."""

from __future__ import annotations

import sys
from typing import Any


def container_classes() -> tuple[type, ...]:
    """The classes whose `.module` is the model inside (FSDP2 does not wrap: its model is the user's module)."""
    from torch.nn import DataParallel
    from torch.nn.parallel import DistributedDataParallel

    classes: list[type] = [DistributedDataParallel, DataParallel]
    if "deepspeed" in sys.modules:  # an engine exists only if deepspeed was imported
        try:
            from deepspeed import DeepSpeedEngine

            classes.append(DeepSpeedEngine)
        except ImportError:  # pragma: no cover
            pass
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel  # FSDP1

        classes.append(FullyShardedDataParallel)
    except ImportError:  # pragma: no cover
        pass
    return tuple(classes)


def strip_containers(model: Any) -> Any:
    """`model` without the containers around it."""
    wrappers = container_classes()
    while isinstance(model, wrappers):
        model = model.module
    return model


def optimized_module_class() -> Any:
    """torch.compile's OptimizedModule, or None when dynamo was never loaded (then nothing was compiled)."""
    eval_frame = sys.modules.get("torch._dynamo.eval_frame")
    return getattr(eval_frame, "OptimizedModule", None)


def is_compiled_module(module: Any) -> bool:
    """Whether `module` is what `torch.compile(model)` returned (an OptimizedModule)."""
    cls = optimized_module_class()
    return cls is not None and isinstance(module, cls)


def compiled_around(compiled: Any, inner: Any) -> Any:
    """`compiled` (an OptimizedModule) when it already wraps `inner`, else a new OptimizedModule around `inner`
    with the same compile settings: `compiled` itself is left as it is (Accelerate re-points its `_orig_mod`,
    which takes a prepared model's DDP wrapper out of its forward)."""
    if compiled._orig_mod is inner:
        return compiled
    return type(compiled)(inner, compiled.dynamo_ctx)
