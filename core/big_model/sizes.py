"""Sizes: memory strings, the tensors of a model (tied ones once), module sizes, unsplittable units."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Iterable

import torch
from torch import nn

from acc.errors import AccError

_UNITS = {"": 1, "B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
          "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "TIB": 2**40}


def parse_memory(value: int | float | str) -> int:
    """Bytes from an int or a string such as "400MB", "10GiB", "1.5 GB" (decimal KB/MB/GB, binary KiB/MiB/GiB)."""
    if isinstance(value, bool):
        raise AccError(f"memory size {value!r}: expected bytes or a string like '400MB' or '10GiB'")
    if isinstance(value, (int, float)):
        if value < 0:
            raise AccError(f"memory size {value!r} is negative")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", str(value))
    unit = match.group(2).upper() if match else None
    if not match or unit not in _UNITS:
        raise AccError(f"memory size {value!r}: expected bytes or a number with one of the units "
                       "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB (e.g. '400MB', '10GiB')")
    return int(float(match.group(1)) * _UNITS[unit])


def format_bytes(n: float) -> str:
    for unit, factor in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if abs(n) >= factor:
            return f"{n / factor:.2f} {unit}"
    return f"{int(n)} B"


def _dtype_bytes(t: torch.Tensor, dtype: torch.dtype | None) -> int:
    if dtype is not None and t.is_floating_point():
        return t.numel() * torch.empty((), dtype=dtype).element_size()
    return t.numel() * t.element_size()


@dataclass
class ModelTensors:
    """Every parameter and buffer of a model by name (tied tensors under each of their names), with sizes.

    `groups[i]` lists the names of unique tensor `i`; `ids[name]` is its index; `bytes[i]` its size
    (floating-point tensors counted in `dtype` when one is given).
    """

    names: list[str] = field(default_factory=list)
    ids: dict[str, int] = field(default_factory=dict)
    groups: list[list[str]] = field(default_factory=list)
    bytes: list[int] = field(default_factory=list)
    is_param: dict[str, bool] = field(default_factory=dict)
    persistent: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, model: nn.Module, dtype: torch.dtype | None = None,
           special_dtypes: dict[str, torch.dtype] | None = None) -> "ModelTensors":
        out = cls()
        by_object: dict[int, int] = {}
        for prefix, module in model.named_modules(remove_duplicate=False):
            base = f"{prefix}." if prefix else ""
            entries = [(n, t, True) for n, t in module._parameters.items()]
            entries += [(n, t, False) for n, t in module._buffers.items()]
            for local, tensor, is_param in entries:
                if tensor is None:
                    continue
                name = base + local
                if name in out.ids:
                    continue
                index = by_object.get(id(tensor))
                if index is None:
                    index = by_object[id(tensor)] = len(out.groups)
                    out.groups.append([])
                    wanted = (special_dtypes or {}).get(name, dtype)
                    out.bytes.append(_dtype_bytes(tensor, wanted))
                out.groups[index].append(name)
                out.ids[name] = index
                out.names.append(name)
                out.is_param[name] = is_param
                out.persistent[name] = is_param or local not in module._non_persistent_buffers_set
        return out

    def tied(self) -> list[list[str]]:
        """Groups of names that refer to one tensor (tied weights)."""
        return [g for g in self.groups if len(g) > 1]

    def total(self) -> int:
        return sum(self.bytes)


def _prefixes(name: str) -> Iterable[str]:
    yield ""
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


def compute_module_sizes(model: nn.Module, dtype: torch.dtype | str | None = None,
                         special_dtypes: dict[str, torch.dtype] | None = None,
                         tensors: ModelTensors | None = None, buffers_only: bool = False) -> dict[str, int]:
    """Bytes of every module (by name, "" for the whole model) and of every tensor; tied tensors count once.
    With `buffers_only`, only buffers are counted."""
    tensors = tensors or ModelTensors.of(model, _as_dtype(dtype), special_dtypes)
    sizes: dict[str, int] = {name: 0 for name, _ in model.named_modules(remove_duplicate=False)}
    for index, names in enumerate(tensors.groups):
        if buffers_only and tensors.is_param[names[0]]:
            continue
        covered = {p for name in names for p in _prefixes(name)}
        for prefix in covered:
            sizes[prefix] = sizes.get(prefix, 0) + tensors.bytes[index]
    return sizes


def _as_dtype(dtype: torch.dtype | str | None) -> torch.dtype | None:
    if dtype is None or isinstance(dtype, torch.dtype):
        return dtype
    value = getattr(torch, str(dtype).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise AccError(f"dtype {dtype!r} is not a torch dtype (e.g. 'float16', 'bfloat16', torch.float32)")
    return value


def no_split_names(model: nn.Module, classes: Iterable[str | type] | None) -> set[str]:
    """Class names that must not be split (given as names or classes); a name matching nothing is an error."""
    names = {c if isinstance(c, str) else c.__name__ for c in (classes or [])}
    present = {type(m).__name__ for m in model.modules()}
    unknown = sorted(names - present)
    if unknown:
        raise AccError(f"no_split_module_classes names {unknown}, but the model has no module of that class; "
                       f"its classes are {sorted(present)}")
    return names


def split_units(prefix: str, module: nn.Module) -> list[tuple[str, nn.Module | None]]:
    """What a module splits into, in order: its own tensors (by name, module None), then its children."""
    base = f"{prefix}." if prefix else ""
    own = [(base + n, None) for n, t in [*module._parameters.items(), *module._buffers.items()] if t is not None]
    return own + [(base + n, child) for n, child in module.named_children()]


def is_atomic(module: nn.Module | None, no_split: set[str]) -> bool:
    """A tensor, a leaf module, or an instance of a no-split class: placed whole."""
    return module is None or type(module).__name__ in no_split or next(module.children(), None) is None


def atomic_units(model: nn.Module, no_split: set[str]) -> list[tuple[str, nn.Module | None]]:
    """The model cut into units placed whole, in order (outermost no-split modules, leaves, loose tensors)."""
    out: list[tuple[str, nn.Module | None]] = []
    stack = [("", model)]
    while stack:
        name, module = stack.pop()
        if is_atomic(module, no_split):
            out.append((name, module))
        else:
            stack.extend(reversed(split_units(name, module)))  # type: ignore[arg-type]
    return out


def largest_unit(model: nn.Module, no_split_module_classes: Iterable[str | type] | None = None,
                 dtype: torch.dtype | str | None = None, sizes: dict[str, int] | None = None) -> tuple[str, int]:
    """The largest unit that is never split (a no-split module, a leaf, a loose tensor): name and bytes."""
    sizes = sizes or compute_module_sizes(model, dtype)
    units = atomic_units(model, no_split_names(model, no_split_module_classes))
    return max(((name, sizes.get(name, 0)) for name, _ in units), key=lambda c: c[1], default=("", 0))
