"""Model-tensor helpers under Accelerate's names (`accelerate.utils.modeling`): move one parameter or buffer
in place, find tied parameters, sizes (of a dtype, of a file size string, of a module with its ties, of its
buffers), the largest layer, read a state dict from a file, offloaded modules' weights. The device-map planning
names (`infer_auto_device_map`, `get_balanced_memory`, `clean_device_map`, ...) are acc.big_model's own."""

from __future__ import annotations

import re
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
from acc.big_model.offload import load_offloaded_weights  # noqa: F401  (Accelerate has it here)
from acc.big_model.offloaded import (  # noqa: F401  (Accelerate's names, acc.big_model's objects)
    align_module_device,
    get_state_dict_from_offload,
    get_state_dict_offloaded_model,
    has_offloaded_params,
)
from acc.big_model.planner import clean_device_map  # noqa: F401
from acc.big_model.tensors import (  # noqa: F401  (Accelerate names for acc.big_model.tensors objects)
    device_name,
    get_non_persistent_buffers,
    named_module_tensors,
    set_module_tensor_to_device,
)

_FLOAT8 = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


def dtype_byte_size(dtype: torch.dtype) -> float:
    """Bytes one element of `dtype` takes (1/8 for bool, 1 for every 8-bit float)."""
    if dtype == torch.bool:
        return 1 / 8
    if any(dtype == getattr(torch, name, None) for name in _FLOAT8):
        return 1
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"`dtype` is not a valid dtype: {dtype}.")
    return torch.empty((), dtype=dtype).element_size()


_SIZE = re.compile(r"([0-9]*\.?[0-9]+)(GIB|MIB|KIB|GB|MB|KB)", re.IGNORECASE)
_UNIT = {"GIB": 2**30, "MIB": 2**20, "KIB": 2**10, "GB": 10**9, "MB": 10**6, "KB": 10**3}


def convert_file_size_to_int(size: int | str) -> int:
    """Bytes from an int (returned as is) or a string with a unit: "5MB" (10**6), "2GiB" (2**30); a lowercase
    final "b" in "Gb", "Mb", "Kb" means bits. Anything else (including a negative size) is a ValueError."""
    if isinstance(size, int) and not isinstance(size, bool):
        if size < 0:
            raise ValueError(f"`size` {size} is not in a valid format: it is negative.")
        return size
    match = _SIZE.fullmatch(str(size))
    if match is None:
        raise ValueError(f"`size` {size} is not in a valid format. Use an integer for bytes, or a string with a unit "
                         "(like '5.0GB' or '2GiB').")
    unit = match.group(2)
    value = int(float(match.group(1)) * _UNIT[unit.upper()])
    return value // 8 if unit[-1] == "b" and unit.upper() in ("GB", "MB", "KB") else value


def compute_module_total_buffer_size(model: nn.Module, dtype: Any = None,
                                     special_dtypes: dict[str, Any] | None = None) -> int:
    """Bytes of all of `model`'s buffers (floating-point ones counted in `dtype` when given)."""
    return compute_module_sizes(model, dtype=dtype, special_dtypes=special_dtypes, buffers_only=True).get("", 0)


def get_module_size_with_ties(tied_params: list[str], module_size: int, module_sizes: dict[str, int],
                              modules_to_treat: list[tuple[str, nn.Module]]) -> tuple[int, list[str], list[nn.Module]]:
    """The size of a module together with the modules (among `modules_to_treat`) that hold the parameters tied to
    it (`tied_params`: their full names), each tied parameter counted once; and those modules' names and objects,
    in the order of `tied_params`."""
    from acc.big_model.auto_map import size_with_ties

    return size_with_ties(tied_params, module_size, module_sizes, modules_to_treat)  # type: ignore[return-value]


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
