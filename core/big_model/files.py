"""Reading tensors one at a time: safetensors headers, checkpoints (file, sharded index, acc checkpoint)
and the offload folder. Torch checkpoints (`.bin`, `.pt`, `.pth`, as transformers and Accelerate save them) are read
with torch's restricted unpickler (`weights_only=True`: tensors and plain containers, never code), memory-mapped.

A tensor is read with one positioned read straight into its own buffer. Nothing is memory-mapped
for longer than that read, because the pages of a mapping count in the process's resident memory
for as long as it stays mapped: reading a 1.2 GB file through a kept mapping would make the
process 1.2 GB large even when only 400 MB of it is kept.
"""

from __future__ import annotations

import ctypes
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from acc.checkpointing.confine import inside
from acc.checkpointing.files import MANIFEST, read_manifest, verify
from acc.errors import CheckpointError

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
           "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
           "BOOL": torch.bool, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
           "U16": torch.uint16, "U32": torch.uint32, "U64": torch.uint64}
INDEX = "model.safetensors.index.json"


@dataclass(frozen=True)
class TensorRecord:
    """Where a tensor's bytes lie in a file, and what they are."""

    path: str
    offset: int
    nbytes: int
    dtype: torch.dtype
    shape: tuple[int, ...]

    def read(self, device: torch.device | str = "cpu") -> torch.Tensor:
        """The tensor, read from disk into fresh memory (then moved to `device`)."""
        if self.nbytes == 0:
            return torch.empty(self.shape, dtype=self.dtype, device=device)
        tensor = self._bytes(self.offset, self.nbytes).view(self.dtype).reshape(self.shape)
        return tensor if torch.device(device).type == "cpu" else tensor.to(device)

    def read_range(self, start: int, stop: int) -> torch.Tensor:
        """Elements [start, stop) of the row-major flattened tensor (1-D), reading only their bytes: how a
        process loads its part of a sharded parameter without a whole copy."""
        size = torch.empty((), dtype=self.dtype).element_size()
        if not 0 <= start <= stop <= self.nbytes // size:
            raise CheckpointError(f"{self.path}: elements {start}..{stop} asked of a tensor of {self.nbytes // size}")
        if stop == start:
            return torch.empty(0, dtype=self.dtype)
        return self._bytes(self.offset + start * size, (stop - start) * size).view(self.dtype)

    def _bytes(self, offset: int, nbytes: int) -> torch.Tensor:
        """`nbytes` bytes of the file from `offset`, with positioned reads straight into a fresh buffer."""
        buffer = torch.empty(nbytes, dtype=torch.uint8)
        view = memoryview((ctypes.c_ubyte * nbytes).from_address(buffer.data_ptr())).cast("B")
        with open(self.path, "rb", buffering=0) as fp:
            fp.seek(offset)
            done = 0
            while done < nbytes:
                count = fp.readinto(view[done:])
                if not count:
                    raise CheckpointError(f"{self.path}: ends before the tensor at byte {offset + done} "
                                          "(truncated file?)")
                done += count
        return buffer


@dataclass(frozen=True)
class LoadedRecord(TensorRecord):
    """A tensor of a torch checkpoint, already loaded (memory-mapped by torch.load): read gives a copy."""

    tensor: torch.Tensor | None = None

    def read(self, device: torch.device | str = "cpu") -> torch.Tensor:
        assert self.tensor is not None
        return self.tensor.to(device, copy=True)

    def read_range(self, start: int, stop: int) -> torch.Tensor:
        assert self.tensor is not None
        return self.tensor.reshape(-1)[start:stop].clone()


@dataclass(frozen=True)
class CastRecord(TensorRecord):
    """A tensor read from disk and cast to `cast` (an offload index may ask for another dtype than the file's)."""

    cast: torch.dtype | None = None

    def read(self, device: torch.device | str = "cpu") -> torch.Tensor:
        tensor = super().read(device)
        return tensor if self.cast is None else tensor.to(self.cast)


def index_records(folder: str | Path | None, index: dict[str, Any]) -> dict[str, TensorRecord]:
    """Records of the weights an Accelerate offload index names (what transformers' from_pretrained hands to
    dispatch_model): an entry with a `safetensors_file` points into that file (`weight_name` in it), any other is
    `<folder>/<name>.dat` with the entry's dtype and shape."""
    headers: dict[str, dict[str, TensorRecord]] = {}
    out: dict[str, TensorRecord] = {}
    for name, info in index.items():
        dtype = _dtype_named(info["dtype"]) if info.get("dtype") is not None else None
        if info.get("safetensors_file") is not None:
            file = str(info["safetensors_file"])
            found = headers.setdefault(file, read_safetensors_index(file)).get(info.get("weight_name", name))
            if found is None:
                raise CheckpointError(f"offload index: '{name}' names {info.get('weight_name', name)!r}, which "
                                      f"{file} does not hold")
            out[name] = CastRecord(found.path, found.offset, found.nbytes, found.dtype, found.shape,
                                   cast=dtype if dtype not in (None, found.dtype) else None)
            continue
        if folder is None or dtype is None or "shape" not in info:
            raise CheckpointError(f"offload index: '{name}' needs dtype and shape and an offload folder, got {info}")
        shape = tuple(int(d) for d in info["shape"])
        numel = 1
        for d in shape:
            numel *= d
        out[name] = TensorRecord(str(Path(folder) / f"{name}.dat"), 0, numel * torch.empty((), dtype=dtype).element_size(),
                                 dtype, shape)
    return out


def _dtype_named(name: str) -> torch.dtype:
    value = getattr(torch, str(name).replace("torch.", ""), None)
    if not isinstance(value, torch.dtype):
        raise CheckpointError(f"offload index: dtype {name!r} is not a torch dtype")
    return value


TORCH_SUFFIXES = (".bin", ".pt", ".pth")


def read_torch_file(path: str | Path) -> dict[str, TensorRecord]:
    """The tensors of a torch checkpoint file (a state dict saved with torch.save), read with `weights_only=True`."""
    path = Path(path)
    try:
        try:
            data = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except RuntimeError:  # a file of the legacy (non-zip) format cannot be memory-mapped
            data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - whatever the unpickler refuses: say what and why
        raise CheckpointError(f"{path}: not a torch state dict that loads with weights_only=True "
                              f"({type(exc).__name__}: {exc})") from None
    if not isinstance(data, dict) or not all(isinstance(v, torch.Tensor) for v in data.values()):
        raise CheckpointError(f"{path}: holds a {type(data).__name__}, not a state dict of tensors")
    return {name: LoadedRecord(str(path), 0, t.numel() * t.element_size(), t.dtype, tuple(t.shape), t)
            for name, t in data.items()}


def read_tensor_file(path: str | Path) -> dict[str, TensorRecord]:
    """The tensors of one weights file, safetensors or torch by its name."""
    return read_torch_file(path) if str(path).endswith(TORCH_SUFFIXES) else read_safetensors_index(path)


def read_safetensors_index(path: str | Path) -> dict[str, TensorRecord]:
    """The tensors of one safetensors file (name -> record), from its header alone."""
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as fp:
            head = fp.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if not 2 <= length <= min(size - 8, 100 * 2**20):
                raise ValueError(f"header length {length} does not fit a file of {size} bytes")
            header = json.loads(fp.read(length))
    except (OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None
    base = 8 + length
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape = _DTYPES[info["dtype"]], tuple(int(d) for d in info["shape"])
            begin, end = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError) as exc:
            raise CheckpointError(f"{path}: tensor '{name}' has a malformed header entry ({exc!r})") from None
        numel = 1
        for d in shape:
            numel *= d
        if end - begin != numel * torch.empty((), dtype=dtype).element_size() or base + end > size:
            raise CheckpointError(f"{path}: tensor '{name}' lies outside the file or has the wrong size")
        out[name] = TensorRecord(str(path), base + begin, end - begin, dtype, shape)
    return out


def open_checkpoint(checkpoint: str | Path) -> dict[str, TensorRecord]:
    """Every tensor of a checkpoint by name: a .safetensors file, a sharded index (.json), a directory
    holding either, or an acc checkpoint (manifest.json + model_<i>.safetensors, checked against the
    manifest first). What an index, a manifest or a directory names is read only when it is a regular file inside
    that directory (`acc.checkpointing.confine`: no `..`, no absolute path, no symbolic link out)."""
    path = Path(checkpoint)
    if path.is_dir():
        return open_checkpoint(_choose_file(path))
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    if path.name.endswith(".json"):
        return _open_index(path)
    if path.name.endswith(TORCH_SUFFIXES):
        return read_torch_file(path)
    if not path.name.endswith(".safetensors"):
        raise CheckpointError(f"{path}: not a checkpoint acc reads: a .safetensors file, a torch state dict (.bin, "
                              f".pt, .pth), a {INDEX} (or another weight-map index .json), or a directory holding "
                              "one of them")
    if (path.parent / MANIFEST).is_file():  # a file of an acc checkpoint: check it before trusting it
        manifest = read_manifest(path.parent)
        if path.name in manifest.get("files", {}):
            verify(path.parent, manifest, path.name)
    return read_safetensors_index(path)


def _choose_file(directory: Path) -> Path:
    if (directory / MANIFEST).is_file():
        manifest = read_manifest(directory)
        models = sorted(n for n in manifest.get("files", {}) if re.fullmatch(r"model_\d+\.safetensors", n))
        if len(models) == 1:
            return inside(directory, models[0], directory / MANIFEST)
        if not models:
            raise CheckpointError(f"{directory}: this acc checkpoint holds no model_<i>.safetensors (its backend "
                                  "writes another layout); load it with Accelerator.load_state")
        raise CheckpointError(f"{directory}: this acc checkpoint holds {len(models)} models ({', '.join(models)}); "
                              f"pass the one to load, e.g. {directory / models[0]}")
    for name in (INDEX, "model.safetensors", "pytorch_model.bin.index.json", "pytorch_model.bin"):
        if (directory / name).is_file() or (directory / name).is_symlink():
            return inside(directory, name)
    candidates = (sorted(directory.glob("*.safetensors.index.json")) or sorted(directory.glob("*.safetensors"))
                  or sorted(directory.glob("*.index.json")) or sorted(directory.glob("*.bin")))
    if len(candidates) == 1:
        return inside(directory, candidates[0].name)
    found = sorted(p.name for p in directory.iterdir())[:10]
    raise CheckpointError(f"{directory}: found no single checkpoint to load (expected {INDEX}, model.safetensors "
                          f"or an acc checkpoint's manifest.json); it holds {found}")


def _open_index(path: Path) -> dict[str, TensorRecord]:
    try:
        data = json.loads(path.read_text())
        weight_map = data.get("weight_map", data)  # transformers' index, or a bare {tensor: file} map
        assert isinstance(weight_map, dict) and all(isinstance(v, str) for v in weight_map.values())
    except (OSError, ValueError, KeyError, TypeError, AttributeError, AssertionError) as exc:
        raise CheckpointError(f"{path}: not a weight-map index (a JSON object with a 'weight_map', or of tensor "
                              f"name -> file): {exc!r}") from None
    shards: dict[str, dict[str, TensorRecord]] = {}
    out = {}
    for name, shard in weight_map.items():
        if shard not in shards:  # a shard is read only when it is a regular file beside the index (no link out)
            shards[shard] = read_tensor_file(inside(path.parent, shard, path))
        if name not in shards[shard]:
            raise CheckpointError(f"{path}: lists '{name}' in {shard}, which does not hold it")
        out[name] = shards[shard][name]
    return out


class OffloadFolder:
    """Tensors written one file each (`<name>.dat`, raw bytes) with `index.json` describing them."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.index: dict[str, dict] = {}

    def write(self, name: str, tensor: torch.Tensor) -> TensorRecord:
        tensor = tensor.detach().to("cpu").contiguous()
        path = self.folder / f"{name}.dat"
        nbytes = tensor.numel() * tensor.element_size()
        with open(path, "wb") as fp:
            if nbytes:
                fp.write(memoryview((ctypes.c_ubyte * nbytes).from_address(tensor.data_ptr())))
        self.index[name] = {"dtype": str(tensor.dtype).replace("torch.", ""), "shape": list(tensor.shape)}
        return TensorRecord(str(path), 0, nbytes, tensor.dtype, tuple(tensor.shape))

    def flush(self) -> None:
        if self.index:
            (self.folder / "index.json").write_text(json.dumps(self.index, indent=1) + "\n")
