"""Layer-wise casting: weights kept in a small storage dtype (e.g. float8) and cast to the compute dtype for each
layer's forward only (Accelerate's `attach_layerwise_casting_hooks` and `LayerwiseCastingHook`), through acc's
module hooks."""

from __future__ import annotations

import re

import torch
from torch import nn

from acc.big_model.module_hooks import ModelHook, add_hook_to_module


class LayerwiseCastingHook(ModelHook):
    """Keeps its module in `storage_dtype`, casting it to `compute_dtype` for the forward and back after it."""

    _is_stateful = False

    def __init__(self, storage_dtype: torch.dtype, compute_dtype: torch.dtype, non_blocking: bool):
        self.storage_dtype, self.compute_dtype, self.non_blocking = storage_dtype, compute_dtype, non_blocking

    def init_hook(self, module: nn.Module) -> nn.Module:
        return module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)

    def pre_forward(self, module: nn.Module, *args: object, **kwargs: object) -> tuple[tuple, dict]:
        module.to(dtype=self.compute_dtype, non_blocking=self.non_blocking)
        return args, kwargs

    def post_forward(self, module: nn.Module, output: object) -> object:
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)
        return output

    def on_error(self, module: nn.Module) -> None:  # a forward that raised leaves the weights in storage too
        module.to(dtype=self.storage_dtype, non_blocking=self.non_blocking)


def attach_layerwise_casting_hooks(module: nn.Module, storage_dtype: torch.dtype, compute_dtype: torch.dtype,
                                   skip_modules_pattern: str | tuple[str, ...] | None = None,
                                   skip_modules_classes: tuple[type[nn.Module], ...] | None = None,
                                   non_blocking: bool = False) -> None:
    """Give every layer of `module` whose kind layer-wise casting supports (convolutions, linear layers:
    `acc.utils.constants.SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING`) a `LayerwiseCastingHook`; layers whose name
    matches one of `skip_modules_pattern` (regular expressions) or of a `skip_modules_classes` class keep their
    dtype, with everything below them."""
    from acc.compat.accelerate_constants import SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING

    patterns = (skip_modules_pattern,) if isinstance(skip_modules_pattern, str) else skip_modules_pattern

    def walk(layer: nn.Module, name: str) -> None:
        if (skip_modules_classes and isinstance(layer, skip_modules_classes)) or \
                (patterns and any(re.search(p, name) for p in patterns)):
            return
        if isinstance(layer, SUPPORTED_PYTORCH_LAYERS_FOR_UPCASTING):
            add_hook_to_module(layer, LayerwiseCastingHook(storage_dtype, compute_dtype, non_blocking), append=True)
            return
        for child_name, child in layer.named_children():
            walk(child, f"{name}.{child_name}" if name else child_name)

    walk(module, "")


__all__ = ["LayerwiseCastingHook", "attach_layerwise_casting_hooks"]
