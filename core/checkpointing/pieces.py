"""Sharded tensors on disk: each process writes its pieces with their place in the whole tensor.

A piece file is a safetensors file whose metadata entry `acc_sharded` maps each tensor name to its
global shape and the offset of this piece in it. Reading assembles any tensor whole from the pieces of
all processes (memory-mapped), whatever the number of processes now: that is what lets a checkpoint
saved on N processes load on M (resharding), and `acc merge-weights` turn one into a single file.
Loading never runs code (safetensors only).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Iterable

import torch

from acc.errors import CheckpointError

META_KEY = "acc_sharded"


def model_prefix(index: int) -> str:
    """The name prefix of prepared model `index`'s tensors in piece files (what merge-weights looks for)."""
    return f"model.{index}."


def piece_of(tensor: torch.Tensor) -> tuple[torch.Tensor, list[int], list[int]]:
    """(local data, global shape, offset of the local data) for a DTensor or a plain (whole) tensor."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:  # pragma: no cover
        DTensor = ()  # type: ignore[assignment]
    if isinstance(tensor, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
        return tensor.to_local(), list(tensor.shape), list(offset)
    return tensor, list(tensor.shape), [0] * tensor.dim()


def save_pieces(tensors: dict[str, torch.Tensor], path: Path) -> None:
    """Write this process's pieces of `tensors` (DTensors or whole tensors) to one safetensors file (inside
    save_state hashed while written, as `save_tensors` writes)."""
    from acc.checkpointing.files import save_tensors as write

    data, meta = {}, {}
    for name, tensor in tensors.items():
        local, shape, offset = piece_of(tensor.detach())
        data[name] = local.contiguous().cpu()
        meta[name] = {"shape": shape, "offset": offset}
    write(data, path, metadata={META_KEY: json.dumps(meta)})


class ShardedReader:
    """Reads tensors whole from the piece files of every process (opened memory-mapped)."""

    def __init__(self, paths: Iterable[Path]):
        from safetensors import safe_open

        self.index: dict[str, list[tuple[Any, dict]]] = {}
        self._handles = []
        for path in paths:
            try:
                handle = safe_open(str(path), framework="pt", device="cpu")
            except Exception as exc:  # noqa: BLE001 - any unreadable file is named
                raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
            meta = (handle.metadata() or {}).get(META_KEY)
            if meta is None:
                raise CheckpointError(f"{path}: not a piece file (no '{META_KEY}' metadata)")
            self._handles.append(handle)
            for name, info in json.loads(meta).items():
                self.index.setdefault(name, []).append((handle, info))

    def names(self) -> list[str]:
        return sorted(self.index)

    def full(self, name: str) -> torch.Tensor:
        """Tensor `name` assembled from its pieces (a missing part of it is an error)."""
        pieces = self.index.get(name)
        if not pieces:
            raise CheckpointError(f"tensor '{name}' is in none of the piece files")
        first = pieces[0][0].get_slice(name)
        shape = pieces[0][1]["shape"]
        out = torch.empty(shape, dtype=_dtype(first.get_dtype()))
        covered = torch.zeros(shape[0] if shape else 1, dtype=torch.bool)
        for handle, info in pieces:
            local = handle.get_tensor(name)
            if not shape:
                out.copy_(local)
                covered[:] = True
                continue
            index = tuple(slice(o, o + n) for o, n in zip(info["offset"], local.shape))
            out[index] = local
            covered[info["offset"][0] : info["offset"][0] + local.shape[0]] = True
        if not bool(covered.all()):
            raise CheckpointError(f"tensor '{name}': the piece files cover only part of it; a process's file is "
                                  "missing from the checkpoint")
        return out


def _dtype(name: str) -> torch.dtype:
    table = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
             "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
             "BOOL": torch.bool}
    return table[name]
