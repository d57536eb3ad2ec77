"""Model-tensor helpers under Accelerate's names (`accelerate.utils.modeling`): move one parameter or buffer
in place, find tied parameters, the largest layer, read a state dict from a file. The device-map
planning names (`infer_auto_device_map`, `get_balanced_memory`, ...) are acc.big_model's own."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn

from acc.big_model import (  # noqa: F401  (Accelerate's acc.utils.modeling names, acc.big_model's objects)
    check_device_map,
    compute_module_sizes,
    get_balanced_memory,
    get_max_memory,
    infer_auto_device_map,
    load_checkpoint_in_model,
)
from acc.big_model.tensors import (  # noqa: F401  (Accelerate names for acc.big_model.tensors objects)
    device_name,
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
)


def find_tied_parameters(model: nn.Module, **kwargs: Any) -> list[list[str]]:
    """Groups of parameter names that are one tensor, e.g. `[['embed.weight', 'head.weight']]` (each sorted)."""
    names: dict[int, list[str]] = {}
    for name, param in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(param), []).append(name)
    return [sorted(group) for group in names.values() if len(group) > 1]


def retie_parameters(model: nn.Module, tied_params: list[list[str]]) -> None:
    """Make each group of `tied_params` one parameter again (the first name's), e.g. after loading."""
    for group in tied_params:
        first = model.get_parameter(group[0])
        for name in group[1:]:
            prefix, _, attr = name.rpartition(".")
            setattr(model.get_submodule(prefix), attr, first)


def get_max_layer_size(modules: list[tuple[str, nn.Module]], module_sizes: dict[str, int],
                       no_split_module_classes: list[str]) -> tuple[int, list[str]]:
    """The size of the largest layer among `modules` (named modules) and the names of the layers of that
    size; a layer is a module without children or of a class in `no_split_module_classes`."""
    best, names = 0, []
    pending = list(modules)
    while pending:
        name, module = pending.pop(0)
        children = list(module.named_children()) if isinstance(module, nn.Module) else []
        if not children or type(module).__name__ in no_split_module_classes:
            size = module_sizes[name]
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending = [(f"{name}.{n}" if name else n, m) for n, m in children] + pending
    return best, names


def load_state_dict(checkpoint_file: str | Path, device_map: dict[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """The tensors of one checkpoint file: a `.safetensors` file (each tensor straight onto its device in
    `device_map`, the longest matching module name winning, CPU otherwise), or a torch file read with
    `weights_only=True` (never runs code from it)."""
    path = str(checkpoint_file)
    if not path.endswith(".safetensors"):
        return torch.load(path, map_location="cpu", weights_only=True)
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        metadata = handle.metadata() or {"format": "pt"}
        keys = list(handle.keys())
    if metadata.get("format", "pt") not in ("pt", "tf", "flax"):
        raise OSError(f"{path} does not hold valid safetensors metadata (format {metadata.get('format')!r})")
    if metadata.get("format", "pt") != "pt":
        raise ValueError(f"{path} was saved with {metadata['format']}; only the pt format can be loaded")
    places: dict[str, Any] = {}
    for key in keys:
        place, best = "cpu", -1
        for module_name, device in (device_map or {}).items():
            if (module_name == "" or key == module_name or key.startswith(module_name + ".")) and \
                    len(module_name) > best:
                place, best = device, len(module_name)
        places[key] = "cpu" if place == "disk" else device_name(place)
    tensors: dict[str, torch.Tensor] = {}
    for device in dict.fromkeys(places.values()):
        with safe_open(path, framework="pt", device=device if not isinstance(device, torch.device) else str(device)) \
                as handle:
            for key in keys:
                if places[key] == device:
                    tensors[key] = handle.get_tensor(key)
    return {key: tensors[key] for key in keys}


__all__ = [
    "check_device_map", "compute_module_sizes", "find_tied_parameters", "get_balanced_memory", "get_max_layer_size",
    "get_max_memory", "get_non_persistent_buffers", "infer_auto_device_map", "load_checkpoint_in_model",
    "load_state_dict", "named_module_tensors", "retie_parameters", "set_module_tensor_to_device",
]
