"""Modules whose weights are offloaded (an offloading hook on them, `AlignDevicesHook(offload=True)` or the
dispatch's `MaterializeHook`: on the meta device between forwards, their values kept by the hook): bring one module's weights onto a device for a block of code, and read a
whole model's state dict from wherever its weights are. Accelerate's names for them are `acc.utils.modeling`.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch import nn

from acc.big_model.dispatch import MaterializeHook
from acc.big_model.module_hooks import AlignDevicesHook, SequentialHook
from acc.big_model.tensors import named_module_tensors, set_module_tensor_to_device


def _offload_hook(module: nn.Module) -> AlignDevicesHook | MaterializeHook | None:
    hook = getattr(module, "_hf_hook", None)
    hooks = hook.hooks if isinstance(hook, SequentialHook) else [hook]
    return next((h for h in hooks if isinstance(h, (AlignDevicesHook, MaterializeHook)) and h.offload), None)


def has_offloaded_params(module: nn.Module) -> bool:
    """Whether `module`'s own weights are offloaded by a hook (on the meta device until a forward)."""
    return _offload_hook(module) is not None


@contextlib.contextmanager
def align_module_device(module: nn.Module, execution_device: Any = None) -> Iterator[None]:
    """Within the block, `module`'s own parameters are on `execution_device`: an offloaded module's are loaded there
    from its weights map (its hook's execution device by default) and released after; another module's are moved
    there (when a device is given) and moved back after. The module's children are not touched."""
    hook = _offload_hook(module)
    if hook is not None:
        saved = hook.execution_device
        if execution_device is not None:
            hook.execution_device = execution_device
        try:
            hook.pre_forward(module)
            yield
        finally:
            hook.post_forward(module, None)
            hook.execution_device = saved
    elif execution_device is not None:
        devices = {name: param.device for name, param in module.named_parameters(recurse=False)}
        try:
            for name in devices:
                set_module_tensor_to_device(module, name, execution_device)
            yield
        finally:
            for name, device in devices.items():
                set_module_tensor_to_device(module, name, device)
    else:
        yield


def get_state_dict_offloaded_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """The state dict of `model` with every offloaded weight read back (on the CPU), one module at a time: the whole
    model is never on the execution device at once."""
    state: dict[str, torch.Tensor] = {}
    for prefix, module in model.named_modules():
        base = f"{prefix}." if prefix else ""
        with align_module_device(module, "cpu"):
            for name, tensor in named_module_tensors(module, remove_non_persistent=True):
                if tensor.device.type == "meta":
                    raise ValueError(f"{base}{name} is on the meta device and no hook holds its value: it cannot be "
                                     "read back (was the model built with init_empty_weights and never loaded?)")
                state[base + name] = tensor.to("cpu")
    return state


def get_state_dict_from_offload(module: nn.Module, module_name: str, state_dict: dict[str, Any],
                                device_to_put_offload: Any = "cpu") -> dict[str, Any]:
    """Fill the entries of `state_dict` that belong to `module` (named by one of its tensors' full names,
    `module_name`, e.g. "linear2.weight") with its tensors, loaded onto `device_to_put_offload` when the module is
    offloaded (left where they are otherwise). Returns `state_dict`."""
    root = module_name.rsplit(".", 1)[0] if "." in module_name else ""
    device = device_to_put_offload if has_offloaded_params(module) else None
    with align_module_device(module, device):
        for key, value in module.state_dict().items():
            name = f"{root}.{key}" if root else key
            if name in state_dict:
                state_dict[name] = value
    return state_dict


__all__ = ["align_module_device", "get_state_dict_from_offload", "get_state_dict_offloaded_model",
           "has_offloaded_params"]
