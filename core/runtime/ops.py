"""Backend-neutral operations on nested structures of tensors (lists, tuples, namedtuples, dicts).

Collectives are passed in as functions (the facade binds them to the hooks), so this module never calls
a hook itself and can be tested without a plugin manager.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Callable

import torch


def is_namedtuple(x: Any) -> bool:
    return isinstance(x, tuple) and hasattr(x, "_fields")


def _rebuild(like: Any, items: list) -> Any:
    if is_namedtuple(like):
        return type(like)(*items)
    if isinstance(like, tuple):
        return tuple(items)
    return type(like)(items) if type(like) is not list else items


def apply(fn: Callable[[torch.Tensor], Any], data: Any, *, leaf: Callable[[Any], bool] | None = None) -> Any:
    """Apply `fn` to every tensor (or every `leaf(x)` object) in `data`, keeping the structure."""
    test = leaf or (lambda x: isinstance(x, torch.Tensor))
    if test(data):
        return fn(data)
    if isinstance(data, (list, tuple)):
        return _rebuild(data, [apply(fn, x, leaf=leaf) for x in data])
    if isinstance(data, Mapping):
        out = {k: apply(fn, v, leaf=leaf) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    return data


def all_tensors(data: Any) -> bool:
    """True when every leaf of `data` (nested lists, tuples, dicts) is a tensor (and there is at least one)."""
    if isinstance(data, torch.Tensor):
        return True
    if isinstance(data, (list, tuple)):
        return bool(data) and all(all_tensors(x) for x in data)
    if isinstance(data, Mapping):
        return bool(data) and all(all_tensors(v) for v in data.values())
    return False


def leaves(data: Any) -> list[torch.Tensor]:
    """The tensors in `data`, in a deterministic order (the order `apply` visits them)."""
    found: list[torch.Tensor] = []
    apply(lambda t: found.append(t), data)
    return found


def replace_leaves(data: Any, new: list) -> Any:
    """`data` with its tensors replaced, in `leaves` order, by the items of `new`."""
    it = iter(new)
    return apply(lambda _t: next(it), data)


def send_to_device(data: Any, device: Any, non_blocking: bool = False, skip_keys: Any = None) -> Any:
    """Move every tensor (and every object with a `.to` method, e.g. tokenizer outputs) to `device`; mapping
    entries whose key is in `skip_keys` (a key or a list of keys) stay where they are."""
    if isinstance(skip_keys, str):
        skip_keys = [skip_keys]
    if isinstance(data, torch.Tensor):
        return data.to(device, non_blocking=non_blocking)
    if isinstance(data, (list, tuple)):
        return _rebuild(data, [send_to_device(x, device, non_blocking, skip_keys) for x in data])
    if isinstance(data, Mapping):
        skip = set(skip_keys or ())
        out = {k: v if k in skip else send_to_device(v, device, non_blocking, skip_keys) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    to = getattr(data, "to", None)
    if callable(to) and not isinstance(data, type):
        try:
            return to(device, non_blocking=non_blocking)
        except TypeError:
            return to(device)
    return data


def batch_size(data: Any) -> int:
    """The size of dim 0 of the first tensor in `data` (0 when there is none)."""
    if isinstance(data, torch.Tensor):
        return data.shape[0] if data.dim() else 1
    if isinstance(data, (list, tuple)):
        if data and not any(isinstance(x, (torch.Tensor, list, tuple, Mapping)) for x in data):
            return len(data)  # a list of plain items (strings, ids) is itself the batch
        for x in data:
            n = batch_size(x)
            if n:
                return n
        return 0
    if isinstance(data, Mapping):
        for v in data.values():
            n = batch_size(v)
            if n:
                return n
    return 0


def slice_batch(data: Any, index: slice) -> Any:
    """`data[index]` along dim 0 for every tensor; plain lists of items are sliced too."""
    if isinstance(data, torch.Tensor):
        return data[index]
    if isinstance(data, (list, tuple)) and data and not any(
        isinstance(x, (torch.Tensor, list, tuple, Mapping)) for x in data
    ):
        return _rebuild(data, list(data[index]))
    if isinstance(data, (list, tuple)):
        return _rebuild(data, [slice_batch(x, index) for x in data])
    if isinstance(data, Mapping):
        out = {k: slice_batch(v, index) for k, v in data.items()}
        try:
            return type(data)(out)
        except TypeError:
            return out
    return data


def concatenate(batches: list, dim: int = 0) -> Any:
    """Join structures of the same shape along `dim`; plain lists of items are concatenated as lists."""
    first = batches[0]
    if isinstance(first, torch.Tensor):
        return torch.cat(batches, dim=dim)
    if isinstance(first, (list, tuple)) and first and not any(
        isinstance(x, (torch.Tensor, list, tuple, Mapping)) for x in first
    ):
        return _rebuild(first, [x for b in batches for x in b])
    if isinstance(first, (list, tuple)):
        return _rebuild(first, [concatenate([b[i] for b in batches], dim) for i in range(len(first))])
    if isinstance(first, Mapping):
        out = {k: concatenate([b[k] for b in batches], dim) for k in first}
        try:
            return type(first)(out)
        except TypeError:
            return out
    raise TypeError(f"cannot concatenate batches of type {type(first).__name__}")


REDUCE_OPS = ("sum", "mean", "max", "min")


def gather(
    data: Any,
    all_gather: Callable[[torch.Tensor], torch.Tensor],
    num_processes: int,
) -> Any:
    """Gather every tensor in `data` from all processes, concatenated along dim 0 in process order.

    Tensors may differ in dim 0 across processes (e.g. a short last batch): sizes are exchanged first,
    shorter ones padded for the collective and the padding cut out again. Other dims must agree; a
    mismatch is a clear error naming the shapes, never a hang.
    """
    tensors = leaves(data)
    if num_processes == 1 or not tensors:
        return apply(lambda t: t if t.dim() else t.reshape(1), data)
    shapes = [list(t.shape) if t.dim() else [1] for t in tensors]
    rank_dims = [len(s) for s in shapes]
    width = max(rank_dims)
    meta = torch.tensor([[len(s), *s, *([0] * (width - len(s)))] for s in shapes], dtype=torch.int64)
    device = tensors[0].device
    all_meta = all_gather(meta.to(device).reshape(1, len(shapes), width + 1)).cpu()
    out = []
    for i, t in enumerate(tensors):
        t = t if t.dim() else t.reshape(1)
        per_rank = [row[i][1 : 1 + int(row[i][0])].tolist() for row in all_meta]
        if any(s[1:] != per_rank[0][1:] for s in per_rank):
            raise ValueError(
                f"gather: tensor #{i} has shapes {per_rank} across processes; only dim 0 may differ. "
                "Pad other dims first (Accelerator.pad_across_processes)"
            )
        sizes = [s[0] for s in per_rank]
        longest = max(sizes)
        if len(sizes) != num_processes or t.shape[0] > longest:
            raise RuntimeError(
                f"gather: the size exchange returned {sizes} for {num_processes} processes, but this process has "
                f"{t.shape[0]} rows: the backend's all_gather does not return every process's data in order"
            )
        if longest != t.shape[0]:
            pad = t.new_zeros((longest - t.shape[0], *t.shape[1:]))
            t = torch.cat([t, pad], dim=0)
        gathered = all_gather(t.contiguous())
        if any(s != longest for s in sizes):
            parts = gathered.split(longest, dim=0)
            gathered = torch.cat([p[:n] for p, n in zip(parts, sizes)], dim=0)
        out.append(gathered)
    return replace_leaves(data, out)


def pad_to(tensor: torch.Tensor, size: int, dim: int, pad_index: Any, pad_first: bool) -> torch.Tensor:
    """`tensor` padded with `pad_index` along `dim` up to `size`."""
    if tensor.shape[dim] >= size:
        return tensor
    shape = list(tensor.shape)
    shape[dim] = size - tensor.shape[dim]
    pad = tensor.new_full(shape, pad_index)
    return torch.cat([pad, tensor] if pad_first else [tensor, pad], dim=dim)


@dataclass
class TensorInformation:
    """A tensor's shape and dtype, without its data (Accelerate's name, in `acc.utils.dataclasses`)."""

    shape: Any
    dtype: Any
