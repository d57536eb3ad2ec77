"""Build a model without allocating its weights: parameters (and optionally buffers) on the meta device."""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn


@contextlib.contextmanager
def init_empty_weights(include_buffers: bool = False) -> Iterator[None]:
    """Modules built inside get parameters on the meta device (shape and dtype, no memory).

    With `include_buffers`, buffers are meta too and every tensor factory defaults to meta, so
    nothing is allocated at all. Without it, buffers are real (their values are often computed in
    `__init__` and absent from checkpoints) and each parameter exists briefly on the CPU before it
    moves to meta. Tied parameters stay tied.
    """
    with init_on_device(torch.device("meta"), include_buffers=include_buffers):
        yield


@contextlib.contextmanager
def init_on_device(device: torch.device | str, include_buffers: bool = False) -> Iterator[None]:
    """Modules built inside register their parameters (and with `include_buffers` their buffers) on `device`."""
    device = torch.device(device)
    if include_buffers:  # every tensor factory defaults to the device: nothing to patch (as Accelerate on torch 2)
        with device:
            yield
        return
    register_parameter = nn.Module.register_parameter

    def on_device_parameter(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register_parameter(module, name, param)
        if param is not None and param.device != device:  # a parameter already moved (tied) is kept as is
            module._parameters[name] = _moved(param, device)

    nn.Module.register_parameter = on_device_parameter  # type: ignore[method-assign]
    try:
        yield
    finally:
        nn.Module.register_parameter = register_parameter  # type: ignore[method-assign]


def _moved(param: nn.Parameter, device: torch.device) -> nn.Parameter:
    data = param.detach().to(device)
    if type(param) is nn.Parameter:
        return nn.Parameter(data, requires_grad=param.requires_grad)
    try:  # a Parameter subclass (quantized weights...) keeps its class and attributes
        return type(param)(data, requires_grad=param.requires_grad, **getattr(param, "__dict__", {}))
    except TypeError:
        return nn.Parameter(data, requires_grad=param.requires_grad)
