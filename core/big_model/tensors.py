"""One tensor of a module at a time: put a parameter or buffer on a device in place (`set_module_tensor_to_device`),
and list a module's tensors and non-persistent buffers. What the hooks and the dispatch move; Accelerate's names for
them are `acc.utils.modeling`.
"""

from __future__ import annotations

from typing import Any, Iterator

import torch
from torch import nn

from acc.runtime.devices import clear_device_cache, vendor_device

_EXACT_KINDS = ("torch.uint", "torch.int", "torch.bool")  # dtypes a dtype change never applies to


def device_name(device: Any) -> Any:
    if isinstance(device, int) and vendor_device("torch_npu", "npu", False):
        return f"npu:{device}"
    return device


def set_module_tensor_to_device(module: nn.Module, tensor_name: str, device: int | str | torch.device,
                                value: torch.Tensor | None = None, dtype: str | torch.dtype | None = None,
                                fp16_statistics: torch.Tensor | None = None,
                                tied_params_map: dict[int, dict[Any, torch.Tensor]] | None = None,
                                non_blocking: bool = False, clear_cache: bool = True) -> None:
    """Put the parameter or buffer `tensor_name` (a dotted name under `module`) on `device`, in place:
    the module keeps a Parameter of the same class (`param.to(device)` would make a new tensor instead).

    `value` replaces the data (needed to leave the meta device; cast to the old dtype unless `dtype` is
    given; the shapes must agree). `tied_params_map` (data pointer -> {device: tensor}) reuses a tied
    weight already put on `device`. `fp16_statistics` is set as the weight's `SCB` (8-bit weights).
    """
    if "." in tensor_name:
        *path, tensor_name = tensor_name.split(".")
        for part in path:
            child = getattr(module, part)
            if child is None:
                raise ValueError(f"{module} has no attribute {part}.")
            module = child
    if tensor_name not in module._parameters and tensor_name not in module._buffers:
        raise ValueError(f"{module} does not have a parameter or a buffer named {tensor_name}.")
    is_buffer = tensor_name in module._buffers
    old_value = getattr(module, tensor_name)

    if tied_params_map is not None:
        for source in (value, old_value):
            if source is not None and source.data_ptr() in tied_params_map and \
                    device in tied_params_map[source.data_ptr()]:
                module._parameters[tensor_name] = tied_params_map[source.data_ptr()][device]
                return
    if old_value.device.type == "meta" and str(device) != "meta" and value is None:
        raise ValueError(f"{tensor_name} is on the meta device, we need a `value` to put in on {device}.")
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.replace("torch.", ""))
    if value is not None:
        if tuple(old_value.shape) != tuple(value.shape):
            raise ValueError(f'Trying to set a tensor of shape {value.shape} in "{tensor_name}" (which has shape '
                             f"{old_value.shape}), this looks incorrect.")
        if dtype is None:
            value = value.to(old_value.dtype, non_blocking=non_blocking)
        elif not str(value.dtype).startswith(_EXACT_KINDS):
            value = value.to(dtype, non_blocking=non_blocking)

    device = device_name(device)
    with torch.no_grad():
        if value is None:
            new_value = old_value.to(device, non_blocking=non_blocking)
            if dtype is not None and str(device) == "meta" and not str(old_value.dtype).startswith(_EXACT_KINDS):
                new_value = new_value.to(dtype)
        elif isinstance(value, torch.Tensor):
            new_value = value.to(device, non_blocking=non_blocking)
        else:
            new_value = torch.tensor(value, device=device)
        if is_buffer:
            module._buffers[tensor_name] = new_value
        elif value is not None or new_value.device != old_value.device or new_value.dtype != old_value.dtype:
            param = module._parameters[tensor_name]
            param_cls = type(param)
            hf_initialized = getattr(param, "_is_hf_initialized", None)
            try:
                new_param = param_cls(new_value, requires_grad=old_value.requires_grad)
            except TypeError:  # a Parameter subclass with other constructor arguments
                new_param = nn.Parameter(new_value, requires_grad=old_value.requires_grad)
            if hf_initialized is not None:
                new_param._is_hf_initialized = hf_initialized
            module._parameters[tensor_name] = new_value = new_param
            if fp16_statistics is not None:
                new_param.SCB = fp16_statistics.to(device, non_blocking=non_blocking)
    if clear_cache and str(device) not in ("cpu", "meta"):
        clear_device_cache()
    if tied_params_map is not None:
        for source in (old_value, value):
            if source is not None and source.data_ptr() in tied_params_map:
                tied_params_map[source.data_ptr()].setdefault(device, new_value)
                break


def get_non_persistent_buffers(module: nn.Module, recurse: bool = False, fqns: bool = False) -> set[str]:
    """Names of the buffers of `module` (with `recurse`, of its submodules; `fqns`: full names) that are not
    saved in its state dict."""
    names = set(module._non_persistent_buffers_set)
    if recurse:
        for prefix, sub in module.named_modules():
            if sub is module:
                continue
            names |= {f"{prefix}.{b}" if fqns else b for b in sub._non_persistent_buffers_set}
    return names


def named_module_tensors(module: nn.Module, include_buffers: bool = True, recurse: bool = False,
                         remove_non_persistent: bool = False) -> Iterator[tuple[str, torch.Tensor]]:
    """The parameters (and buffers, unless `include_buffers=False`) of `module` itself, or with `recurse` of
    its whole subtree; `remove_non_persistent` leaves out buffers absent from the state dict."""
    yield from module.named_parameters(recurse=recurse)
    if include_buffers:
        skip = get_non_persistent_buffers(module, recurse=recurse, fqns=True) if remove_non_persistent else set()
        for name, buffer in module.named_buffers(recurse=recurse):
            if name not in skip:
                yield name, buffer


__all__ = ["get_non_persistent_buffers", "named_module_tensors", "set_module_tensor_to_device"]
