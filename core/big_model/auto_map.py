"""The automatic device map: Accelerate's greedy placement, so that `device_map="auto"` gives the map Accelerate 1.15
gives for the same model and budgets (transformers' `from_pretrained(device_map="auto")` relies on it).

The model's direct parameters, children and buffers are placed in order, each on the current device while it fits
(with the modules that hold parameters tied to it); what does not fit is split into its own parameters and children
(a module of a `no_split_module_classes` class never is), or, when it cannot be split, the placement moves on to the
next device: GPUs in order, then the CPU, then disk (unlimited). The main devices (the first GPU and the CPU, or
mps) keep room for the largest unsplittable layer still to place, which is loaded there to run when offloaded. With
`fallback_allocation`, a device that would stay empty takes the first module (breadth first) that fits on it.

Sizes count a tied tensor once, under its first name, as Accelerate's `compute_module_sizes` does.
"""

from __future__ import annotations

import logging
import warnings
from collections import defaultdict
from typing import Any, Iterable

import torch
from torch import nn

from acc.big_model.sizes import _as_dtype

logger = logging.getLogger(__name__)

Entry = tuple[str, Any]  # a name and its module, parameter or buffer
_EXACT = ("torch.uint", "torch.int", "torch.bool")  # dtypes a dtype change never applies to


def _bytes_per(dtype: torch.dtype) -> float:
    return 1 / 8 if dtype == torch.bool else torch.empty((), dtype=dtype).element_size()


def module_sizes(model: nn.Module, dtype: Any = None, special_dtypes: dict[str, Any] | None = None,
                 buffers_only: bool = False) -> dict[str, float]:
    """Bytes of every module and tensor by name ("" for the model); a tied tensor counts once, under its first name.
    Floating-point tensors are counted in `dtype` when it is smaller than theirs (`special_dtypes` by name)."""
    wanted = _as_dtype(dtype)
    special = {k: _as_dtype(v) for k, v in (special_dtypes or {}).items()}
    sizes: dict[str, float] = defaultdict(int)
    tensors = model.named_buffers() if buffers_only else [*model.named_parameters(), *model.named_buffers()]
    for name, tensor in tensors:
        per = _bytes_per(tensor.dtype)
        if name in special:
            per = _bytes_per(special[name])  # type: ignore[arg-type]
        elif wanted is not None and not str(tensor.dtype).startswith(_EXACT):
            per = min(per, _bytes_per(wanted))
        size = tensor.numel() * per
        parts = name.split(".")
        for i in range(len(parts) + 1):
            sizes[".".join(parts[:i])] += size
    return sizes


def _children(entry: Any) -> list[Entry]:
    return [] if isinstance(entry, torch.Tensor) else list(entry.named_children())


def _splittable(entry: Any, no_split: set[str]) -> bool:
    return bool(_children(entry)) and type(entry).__name__ not in no_split


def _split(name: str, module: nn.Module) -> list[Entry]:
    """A module's own parameters, then its children, under full names."""
    return [(f"{name}.{n}", v) for n, v in [*module.named_parameters(recurse=False), *module.named_children()]]


def largest_layer(entries: Iterable[Entry], sizes: dict[str, float], no_split: set[str]) -> tuple[float, list[str]]:
    """The size of the largest unsplittable layer among `entries` (modules only, split down to their leaves or
    no-split modules) and the names of the layers of that size."""
    best, names = 0.0, []
    todo = [(n, m) for n, m in entries if isinstance(m, nn.Module)]
    while todo:
        name, module = todo.pop(0)
        if _splittable(module, no_split):
            todo = [(f"{name}.{n}", v) for n, v in module.named_children()] + todo
        elif sizes[name] > best:
            best, names = sizes[name], [name]
        elif sizes[name] == best:
            names.append(name)
    return best, names


def size_with_ties(tied: list[str], size: float, sizes: dict[str, float],
                   entries: list[Entry]) -> tuple[float, list[str], list[Any]]:
    """The size of an entry together with the entries that hold the parameters tied to it (`tied`, full names),
    each tied parameter once; and those entries' names and objects, in the order of `tied`."""
    names, objects = [], []
    for param in tied:
        name, obj = next((n, m) for n, m in entries if param.startswith(n + "."))
        names.append(name)
        objects.append(obj)
        size += sizes[name] - sizes[param]
    return size, names, objects


def _tied_outside(name: str, tied_groups: list[list[str]]) -> list[str]:
    """Parameters tied to one inside `name` that lie outside it ("a.weight" is not inside "a.weight_sub")."""
    inside = [g for g in tied_groups if any(name + "." in p + "." for p in g) and not all(name + "." in p + "." for p in g)]
    return [p for g in inside for p in g if name + "." not in p + "."]


def _fallback(entries: list[Entry], sizes: dict[str, float], limit: float, no_split: set[str],
              tied_groups: list[list[str]]) -> tuple[Entry | None, list[Entry]]:
    """The first entry (breadth first, splitting what may be split) that fits in `limit` with its ties, and the
    entries left once it is taken out."""
    todo = list(entries)
    while todo:
        name, obj = todo.pop(0)
        if size_with_ties(_tied_outside(name, tied_groups), sizes[name], sizes, todo)[0] <= limit:
            return (name, obj), todo
        if _splittable(obj, no_split):
            todo = _split(name, obj) + todo
    return None, entries


def plan(model: nn.Module, budgets: dict[Any, int], no_split: set[str], tied_groups: list[list[str]],
         sizes: dict[str, float], buffer_size: Any, offload_buffers: bool = False,
         fallback_allocation: bool = False, verbose: bool = False) -> tuple[dict[str, Any], dict[Any, tuple[str, float]]]:
    """The device map (uncleaned) for `budgets` ({device: bytes}, GPUs first; disk is added, unlimited), and the room
    each main device kept free when the placement moved past it (its largest layer's name and size)."""
    devices = list(budgets) + ([] if "disk" in budgets else ["disk"])
    gpus = [d for d in devices if d not in ("cpu", "disk")]
    main = ["mps"] if "mps" in gpus else [gpus[0], "cpu"] if gpus else ["cpu"]
    entries: list[Entry] = [*model.named_parameters(recurse=False), *model.named_children(),
                            *model.named_buffers(recurse=False)]
    device_map: dict[str, Any] = {}
    used = {d: 0.0 for d in devices}
    buffers: dict[Any, float] = {}
    unplaced: dict[Any, float] = {}
    kept: dict[Any, tuple[str, float]] = {}
    current = 0
    layer, layer_names = largest_layer(entries, sizes, no_split)
    while entries:
        name, obj = entries.pop(0)
        layer_names = [n for n in layer_names if n != name and not n.startswith(name + ".")]
        if not layer_names:
            layer, layer_names = largest_layer(entries, sizes, no_split)
        size = sizes[name]
        tied = _tied_outside(name, tied_groups)
        device = devices[current]
        limit = None if device == "disk" else budgets[device]
        reserved = layer if device in main else 0
        if limit is not None:
            limit -= reserved
        with_ties, tied_names, tied_objects = size_with_ties(tied, size, sizes, entries)
        if limit is None or used[device] + with_ties <= limit:
            if verbose:
                print(f"{name}{' and ' + str(tied_names) if tied_names else ''} ({with_ties} B) -> {device}")
            used[device] += with_ties
            device_map[name] = device
            for tied_name in tied_names:
                entries = [e for e in entries if e[0] != tied_name]
                device_map[tied_name] = device
            if not offload_buffers and isinstance(obj, nn.Module):
                buffers[device] = buffers.get(device, 0) + buffer_size(obj)
            continue
        if tied and used[device] + size <= limit:  # it fits alone: split a tied module to make the pair fit
            target = next(((n, m) for n, m in zip(tied_names, tied_objects) if _splittable(m, no_split)), None)
            if target is not None:
                index = next(i for i, (n, _) in enumerate(entries) if n == target[0])
                entries = [(name, obj), *entries[:index], *_split(*target), *entries[index + 1:]]
                layer, layer_names = largest_layer(entries, sizes, no_split)
                continue
        if used[device] + size >= limit and _splittable(obj, no_split):
            entries = _split(name, obj) + entries
            layer, layer_names = largest_layer(entries, sizes, no_split)
            continue
        if used[device] == 0 and fallback_allocation and device != "disk":
            found, rest = _fallback(entries, sizes, budgets[device] - max(layer, with_ties), no_split, tied_groups)
            if found is not None:
                entries = [found, (name, obj), *rest]
                continue
        if used[device] == 0:
            unplaced[device] = with_ties + reserved
        elif reserved:
            kept[device] = (layer_names[0] if layer_names else name, reserved)
        used[device] += reserved
        current += 1
        entries.insert(0, (name, obj))
    _say_about_buffers(budgets, used, buffers, gpus, offload_buffers)
    if "disk" in budgets and used["disk"] > budgets["disk"]:
        warnings.warn(f"the plan puts {int(used['disk'])} bytes on disk, above max_memory['disk'] = {budgets['disk']}: "
                      "disk is not limited by the plan (as in Accelerate)", UserWarning, stacklevel=3)
    if unplaced:
        logger.info("no module could be placed on these devices (insufficient memory):\n"
                    + "\n".join(f"  - {d}: {int(m)} bytes needed" for d, m in unplaced.items())
                    + "\nthese minimums hold for this placement only; give the devices more memory, or change the model")
    return device_map, kept


def _say_about_buffers(budgets: dict[Any, int], used: dict[Any, float], buffers: dict[Any, float], gpus: list[Any],
                       offload_buffers: bool) -> None:
    """Buffers of offloaded modules are loaded onto the GPU with the model (unless offload_buffers): warn when no
    GPU has room for them."""
    offloaded = buffers.get("cpu", 0) + buffers.get("disk", 0)
    if offloaded <= 0 or offload_buffers or not gpus:
        return
    if not any(budget >= offloaded + used.get(d, 0) for d, budget in budgets.items() if d not in ("cpu", "disk")):
        warnings.warn(f"the offloaded modules' buffers take {int(offloaded)} bytes, which fit on no GPU beside what is "
                      "placed there; they are loaded onto the GPU all at once when the model runs: if it runs out of "
                      "memory, pass offload_buffers=True", UserWarning, stacklevel=3)
