"""Device maps: memory budgets per device, the automatic plan (GPUs in order, then CPU, then disk),
and the checks a hand-written map must pass."""

from __future__ import annotations

import os
import warnings
from collections import deque
from typing import Any, Iterable

import torch
from torch import nn

from acc.big_model.sizes import (
    ModelTensors,
    _as_dtype,
    _prefixes,
    atomic_units,
    compute_module_sizes,
    format_bytes,
    is_atomic,
    no_split_names,
    parse_memory,
    split_units,
)
from acc.errors import AccError, did_you_mean

Device = Any  # an int (GPU index), "mps", "cpu" or "disk"
PLACES = ("an int GPU index (0, 1, ...)", "'cuda:N'", "'mps'", "'cpu'", "'disk'")


class DeviceMapError(AccError, ValueError):
    """A device map or memory budget that cannot work (unknown names, a unit that fits nowhere, ...)."""


def device_key(value: Any) -> Device:
    """0, "0", "cuda:0", torch.device("cuda", 0) -> 0; "cpu", "mps", "disk" as they are."""
    if isinstance(value, torch.device):
        value = str(value)
    if isinstance(value, bool):
        raise DeviceMapError(f"device {value!r} is not valid; use one of {', '.join(PLACES)}")
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, str):
        text = value.strip().lower()
        if text.isdigit():
            return int(text)
        if text in ("cuda", "cuda:0"):
            return 0
        if text.startswith("cuda:") and text[5:].isdigit():
            return int(text[5:])
        if text in ("cpu", "disk", "mps"):
            return text
    raise DeviceMapError(f"device {value!r} is not valid; use one of {', '.join(PLACES)}")


def _order(key: Device) -> tuple[int, int]:
    return (0, key) if isinstance(key, int) else ({"mps": 1, "cpu": 2, "disk": 3}[key], 0)


def available_cpu_memory() -> int:
    """MemAvailable from /proc/meminfo (Linux), else free physical pages."""
    try:
        with open("/proc/meminfo") as fp:
            for line in fp:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return 8 * 2**30


def get_max_memory(max_memory: dict[Any, int | str] | None = None) -> dict[Device, int]:
    """Budgets in bytes, ordered GPUs, mps, cpu, disk. Given none: 90% of each GPU's free memory and of
    the available CPU memory (disk is unlimited and added by the planner). Sizes given as strings ("10GiB") are
    converted in the given dict too, as Accelerate's get_max_memory does."""
    if max_memory is None:
        found: dict[Device, int] = {}
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                found[i] = int(torch.cuda.mem_get_info(i)[0] * 0.9)
        found["cpu"] = int(available_cpu_memory() * 0.9)
        return found
    if not isinstance(max_memory, dict):
        raise DeviceMapError(f"max_memory must be a dict like {{0: '20GiB', 'cpu': '60GiB'}}, not {max_memory!r}")
    for key, value in list(max_memory.items()):
        if isinstance(value, str):  # in the caller's dict too, as Accelerate does (transformers reads it after)
            max_memory[key] = parse_memory(value)
    out = {device_key(k): parse_memory(v) for k, v in max_memory.items()}
    return dict(sorted(out.items(), key=lambda kv: _order(kv[0])))


def execution_device(devices: Iterable[Device]) -> Device:
    """Where offloaded modules run: the first GPU (else mps, else cpu)."""
    ordered = sorted(set(devices) | {"cpu"}, key=_order)
    return ordered[0] if ordered[0] != "disk" else "cpu"


class DeviceMap(dict):
    """A device map ({name: device}) that prints as a table with each entry's size and each device's total.

    It is a plain dict otherwise: edit it and pass it to `dispatch_model`/`load_checkpoint_and_dispatch`.
    """

    sizes: dict[str, int]
    budgets: dict[Device, int]
    reserved: dict[Device, tuple[str, int]]
    tensors: ModelTensors | None = None

    def totals(self) -> dict[Device, int]:
        """Bytes per device, each tied tensor counted once (needs the model this map was planned for)."""
        out: dict[Device, int] = {}
        if self.tensors is not None:
            for names, size in zip(self.tensors.groups, self.tensors.bytes):
                device = lookup(self, names[0])
                out[device] = out.get(device, 0) + size
        return out

    def __str__(self) -> str:
        sizes = getattr(self, "sizes", {})
        width = max([len(k) for k in self] + [7])
        lines = [f"{'module':{width}}  {'device':6}  size"]
        for name, device in self.items():
            size = sizes.get(name)
            lines.append(f"{name or '(model)':{width}}  {str(device):6}  {format_bytes(size) if size is not None else '?'}")
        totals, budgets = self.totals(), getattr(self, "budgets", {})
        for device in sorted(set(totals) | set(budgets), key=lambda d: _order(device_key(d))):
            line = f"{'GPU ' + str(device) if isinstance(device, int) else device}: {format_bytes(totals.get(device, 0))}"
            if device in budgets and device != "disk":
                line += f" of {format_bytes(budgets[device])}"
            if device in getattr(self, "reserved", {}):
                name, size = self.reserved[device]
                line += f" ({format_bytes(size)} kept free for loading offloaded units, the largest being '{name}')"
            lines.append(line)
        return "\n".join(lines)


class _Planner:
    def __init__(self, model: nn.Module, tensors: ModelTensors, no_split: set[str], verbose: bool):
        self.model, self.tensors, self.no_split, self.verbose = model, tensors, no_split, verbose
        self.modules = dict(model.named_modules(remove_duplicate=False))

    def ids_under(self, name: str) -> set[int]:
        if name in self.tensors.ids:
            return {self.tensors.ids[name]}
        module = self.modules[name]
        names = [n for n, _ in module.named_parameters(name, remove_duplicate=False)]
        names += [n for n, _ in module.named_buffers(name, remove_duplicate=False)]
        return {self.tensors.ids[n] for n in names}

    def owner(self, tensor: str) -> str:
        """The unit a tensor is placed with: its outermost no-split module, its leaf module, or itself."""
        parts = tensor.split(".")
        for i in range(len(parts)):
            prefix = ".".join(parts[:i])
            if type(self.modules[prefix]).__name__ in self.no_split:
                return prefix
        parent = self.modules[".".join(parts[:-1])]
        return ".".join(parts[:-1]) if next(parent.children(), None) is None else tensor

    def group(self, name: str, assigned: dict[str, Device]) -> list[str]:
        """`name` and the units holding other names of its tied tensors, which must share its device."""
        group, todo = [name], [name]
        while todo:
            unit = todo.pop()
            for index in self.ids_under(unit):
                for other in self.tensors.groups[index]:
                    if any(_inside(other, g) for g in group):
                        continue
                    partner = self.owner(other)
                    if any(_inside(g, partner) for g in group):  # the owner contains the group: place the tensor
                        partner = other
                    if not _covered(partner, assigned):
                        group.append(partner)
                        todo.append(partner)
        return group

    def plan(self, devices: list[tuple[Device, int]]) -> dict[str, Device]:
        assigned: dict[str, Device] = {}
        holds: set[str] = set()  # modules with something assigned inside
        placed: set[int] = set()
        queue: deque[tuple[str, nn.Module | None]] = deque([("", self.model)])
        current, used = 0, 0
        while queue:
            name, module = queue.popleft()
            if _covered(name, assigned):
                continue
            if name in holds and module is not None:
                queue.extendleft(reversed(split_units(name, module)))
                continue
            group = self.group(name, assigned)
            ids = set().union(*(self.ids_under(g) for g in group)) - placed
            size = sum(self.tensors.bytes[i] for i in ids)
            while True:
                device, capacity = devices[current]
                if used + size <= capacity:
                    for unit in group:
                        assigned[unit] = device
                        holds.update(list(_prefixes(unit))[:-1])
                    placed |= ids
                    used += size
                    if self.verbose:
                        print(f"{', '.join(g or '(model)' for g in group)} ({format_bytes(size)}) -> {device}")
                    break
                if not is_atomic(module, self.no_split):
                    queue.extendleft(reversed(split_units(name, module)))  # type: ignore[arg-type]
                    break
                if current + 1 == len(devices):
                    total = sum(cap for _, cap in devices)
                    raise DeviceMapError(
                        f"the model does not fit in max_memory: '{name or '(model)'}' ({format_bytes(size)}) fits "
                        f"on no device after the earlier modules (budgets total {format_bytes(total)}, the model "
                        f"needs {format_bytes(self.tensors.total())}); raise a budget or leave 'disk' unbounded")
                current, used = current + 1, 0
        return assigned

    def clean(self, assigned: dict[str, Device]) -> dict[str, Device]:
        """The shortest map with the same placement: a module whose contents share one device is one entry."""
        memo: dict[str, set[Device]] = {}

        def devices(name: str, module: nn.Module | None) -> set[Device]:
            if name not in memo:
                if name in assigned:
                    memo[name] = {assigned[name]}
                else:
                    memo[name] = set().union(*(devices(n, m) for n, m in split_units(name, module)))  # type: ignore[arg-type]
            return memo[name]

        out: dict[str, Device] = {}

        def emit(name: str, module: nn.Module | None) -> None:
            found = devices(name, module)
            if len(found) == 1:
                out[name] = next(iter(found))
            elif found:
                for child, sub in split_units(name, module):  # type: ignore[arg-type]
                    emit(child, sub)

        emit("", self.model)
        return out


def _inside(name: str, unit: str) -> bool:
    return unit == "" or name == unit or name.startswith(unit + ".")


def _covered(name: str, assigned: dict[str, Device]) -> bool:
    return any(p in assigned for p in _prefixes(name))


def infer_auto_device_map(model: nn.Module, max_memory: dict[Any, int | str] | None = None,
                          no_split_module_classes: Iterable[str | type] | None = None,
                          dtype: torch.dtype | str | None = None,
                          special_dtypes: dict[str, torch.dtype] | None = None, verbose: bool = False,
                          clean_result: bool = True, offload_buffers: bool = False,
                          fallback_allocation: bool = False) -> DeviceMap:
    """Place the model on the GPUs in order, then the CPU, then disk, each within its budget, the way Accelerate
    1.15 does (`acc.big_model.auto_map` says how): the same model and budgets give Accelerate's map.

    A module that does not fit where the fill stands is split into its parameters and children, except instances
    of `no_split_module_classes`, which move whole to the next device. Modules holding tied parameters go together.
    The first GPU and the CPU keep room for the largest unsplittable layer, which is loaded there to run when
    offloaded. `offload_buffers`: offloaded modules' buffers are not counted on the GPU (a warning says when they
    would not fit there); `fallback_allocation`: a device that would stay empty takes the first module that fits.
    Only plans: fake GPU budgets work without CUDA.
    """
    from acc.big_model import auto_map

    budgets = get_max_memory(max_memory)
    no_split = no_split_names(model, no_split_module_classes)
    sizes = auto_map.module_sizes(model, dtype, special_dtypes)
    tied = [sorted(g) for g in ModelTensors.of(model).tied()]

    def buffer_size(module: nn.Module) -> float:
        return auto_map.module_sizes(module, dtype, special_dtypes, buffers_only=True)[""]

    assigned, kept = auto_map.plan(model, budgets, no_split, tied, sizes, buffer_size, offload_buffers=offload_buffers,
                             fallback_allocation=fallback_allocation, verbose=verbose)
    result = DeviceMap(clean_device_map(assigned) if clean_result else assigned)
    result.sizes = {k: int(v) for k, v in sizes.items()}
    result.budgets, result.tensors = budgets, ModelTensors.of(model, _as_dtype(dtype), special_dtypes)
    result.reserved = {d: (n, int(size)) for d, (n, size) in kept.items()}
    return result


def get_balanced_memory(model: nn.Module, max_memory: dict[Any, int | str] | None = None,
                        no_split_module_classes: Iterable[str | type] | None = None,
                        dtype: torch.dtype | str | None = None,
                        special_dtypes: dict[str, torch.dtype] | None = None, low_zero: bool = False) -> dict[Device, int]:
    """Budgets that spread the model evenly over several GPUs (with `low_zero`, GPU 0 gets only room to run).

    With fewer than two GPUs the budgets are returned unchanged.
    """
    budgets = get_max_memory(max_memory)
    gpus = [d for d in budgets if isinstance(d, int)]
    if len(gpus) < 2:
        return budgets
    tensors = ModelTensors.of(model, _as_dtype(dtype), special_dtypes)
    sizes = compute_module_sizes(model, tensors=tensors)
    no_split = no_split_names(model, no_split_module_classes)
    largest = max((sizes.get(n, 0) for n, _ in atomic_units(model, no_split)), default=0)
    sharing = gpus[1:] if low_zero else gpus
    share = tensors.total() // len(sharing) + largest
    out = dict(budgets)
    for gpu in sharing:
        out[gpu] = min(budgets[gpu], share)
    if low_zero:
        out[gpus[0]] = min(budgets[gpus[0]], largest)
    return out


def check_device_map(model: nn.Module, device_map: dict[str, Any],
                     tensors: ModelTensors | None = None) -> dict[str, Device]:
    """Validate a device map against the model and return it normalized (devices as 0, 'cpu', 'disk'...).

    A name that is no module or tensor of the model is warned about and left out (as Accelerate does); every
    tensor must be covered, and tied tensors must land on one device.
    """
    if not isinstance(device_map, dict):
        raise DeviceMapError(f"device_map must be a dict {{module name: device}} or 'auto', not {device_map!r}")
    tensors = tensors or ModelTensors.of(model)
    modules = {name for name, _ in model.named_modules(remove_duplicate=False)}
    out: dict[str, Device] = {}
    unknown = [name for name in device_map if name not in modules and name not in tensors.ids]
    if unknown:  # as Accelerate: said, and left out of the map (a tensor they were meant for is then missing below)
        hints = "".join(did_you_mean(name, sorted(modules - {''}) + tensors.names) for name in unknown[:5])
        warnings.warn(f"device_map keys do not match any submodules or tensors of {type(model).__name__} and are "
                      f"ignored: {unknown}{hints}; top-level modules: {[n for n, _ in model.named_children()][:20]}",
                      UserWarning, stacklevel=2)
    for name, device in device_map.items():
        if name in unknown:
            continue
        try:
            out[name] = device_key(device)
        except DeviceMapError as exc:
            raise DeviceMapError(f"device_map['{name}']: {exc}") from None
    missing = [n for n in tensors.names if lookup(out, n) is None]
    if missing:
        parents = sorted({n.rsplit(".", 1)[0] if "." in n else n for n in missing})
        raise DeviceMapError(f"device_map places no device for {len(missing)} tensor(s), e.g. {missing[:5]}; add "
                             f"them or their modules (e.g. {parents[:5]}) to the map, or map '' for the rest")
    for group in tensors.tied():
        places = {n: lookup(out, n) for n in group}
        if len(set(places.values())) > 1:
            raise DeviceMapError(f"tied tensors {group} are placed on different devices ({places}); tied weights "
                                 "share one device: place their modules together")
    return out


def lookup(device_map: dict[str, Device], name: str) -> Device | None:
    """The device of `name`: the entry of the longest module/tensor name that contains it."""
    for prefix in reversed(list(_prefixes(name))):
        if prefix in device_map:
            return device_map[prefix]
    return None


def clean_device_map(device_map: dict[str, Any], module_name: str = "") -> dict[str, Any]:
    """`device_map` with every module whose entries all go to one device written as that module alone
    (`{"a.x": 0, "a.y": 0}` -> `{"a": 0}`), from `module_name` down; changed in place and returned."""
    prefix = f"{module_name}." if module_name else ""
    inside = [k for k in device_map if k.startswith(prefix) or k == module_name]
    values = {str(device_map[k]) for k in inside}
    if len(inside) > 1 and len(values) == 1:
        value = device_map[inside[0]]
        for key in inside:
            del device_map[key]
        device_map[module_name] = value
        return device_map
    depth = len(module_name.split(".")) + 1 if module_name else 1
    children = dict.fromkeys(".".join(k.split(".")[:depth]) for k in inside if k != module_name)
    for child in children:
        clean_device_map(device_map, child)
    return device_map
