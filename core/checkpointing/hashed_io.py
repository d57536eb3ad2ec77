"""Checkpoint bytes in one pass: files hashed while they are written, flushed to disk once, checked fast on load.

Inside `recording()` (what `save_state` opens around every write of a checkpoint), `write_safetensors` and
`HashedFile` (the file `save_object` hands to `torch.save`) hash each block as they write it (the hash of a large
block runs on a helper thread while the block is written), fsync the file once when it is closed, and record its
size and checksum. The kernel then lists the recorded files in the manifest without reading them back; a file it
has no record of (a backend that wrote it another way), or one changed since it was recorded (its inode, size or
modification time differ), is read back and hashed as before.

Checksums are BLAKE3 (a cryptographic hash, 4-8 GB/s here against sha256's 1.7, which made verifying a
checkpoint cost more than loading it); entries of checkpoints written by acc 0.1 carry sha256 and still verify.
"""

from __future__ import annotations

import contextvars
import hashlib
import json
import os
import struct
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterator

ALGORITHM = "blake3"  # what new checkpoints record
ALGORITHMS = ("blake3", "sha256")  # what manifests may record (sha256: checkpoints of acc 0.1)
_BLOCK = 8 << 20  # hashed and written together; larger writes are split into blocks
_OVERLAP = 1 << 20  # blocks at least this large are hashed on the helper thread while being written
_MANY_THREADS = 16 << 20  # files at least this large are verified with BLAKE3's own threads

_record: contextvars.ContextVar[dict[str, dict[str, Any]] | None] = contextvars.ContextVar("acc_written",
                                                                                             default=None)
_helper: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own
_helper_lock = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    global _helper, _helper_lock
    if _helper is not None and _helper[0] != os.getpid():  # forked: the parent's threads do not exist here
        _helper, _helper_lock = None, threading.Lock()
    with _helper_lock:
        if _helper is None:
            _helper = (os.getpid(), ThreadPoolExecutor(max_workers=2, thread_name_prefix="acc-hash"))
        return _helper[1]


def new_hasher(algorithm: str = ALGORITHM) -> Any:
    """A hash object (`update`, `hexdigest`) for `algorithm` ("blake3" or "sha256")."""
    if algorithm == "blake3":
        import blake3

        return blake3.blake3()
    if algorithm == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown checksum algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")


def algorithm_of(entry: dict[str, Any]) -> str | None:
    """Which checksum a manifest entry carries (None: none of the known ones)."""
    return next((a for a in ALGORITHMS if a in entry), None)


# ------------------------------------------------------------------------------------------ recording


@contextmanager
def recording() -> Iterator[dict[str, dict[str, Any]]]:
    """Within this block files written through this module are hashed while written, fsynced, and recorded
    (resolved path -> {"size", checksum, "_stat"}); yields the record."""
    record: dict[str, dict[str, Any]] = {}
    token = _record.set(record)
    try:
        yield record
    finally:
        _record.reset(token)


def is_recording() -> bool:
    return _record.get() is not None


def _stat_key(st: os.stat_result) -> tuple[int, int, int, int]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)


def recorded(record: dict[str, dict[str, Any]], path: Path) -> dict[str, Any] | None:
    """The manifest entry recorded for `path` while it was written, if the file is still the one written."""
    entry = record.get(str(Path(path).resolve()))
    if entry is None:
        return None
    try:
        if _stat_key(os.stat(path)) != entry["_stat"]:
            return None
    except OSError:
        return None
    return {k: v for k, v in entry.items() if k != "_stat"}


def run_concurrently(jobs: list[Callable[[], Any]], max_workers: int | None = None) -> list[Any]:
    """Run independent writes at the same time (threads, each in the caller's context, so they are recorded).
    Every job finishes before this returns; the first exception is raised. With one job or one CPU they run in
    turn (threads gain nothing there)."""
    workers = min(len(jobs), max_workers or 4, os.cpu_count() or 1)
    if workers <= 1:
        return [job() for job in jobs]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="acc-write") as pool:
        futures = [pool.submit(contextvars.copy_context().run, job) for job in jobs]
        errors = [f.exception() for f in futures]
        first = next((e for e in errors if e is not None), None)
        if first is not None:
            raise first
        return [f.result() for f in futures]


# ------------------------------------------------------------------------------------------ writing


class HashedFile:
    """A write-only binary file that hashes what is written to it; `close()` fsyncs it once and returns its
    manifest entry (recorded when a `recording()` is active). Use as a context manager: on an exception the file
    is closed and nothing is recorded."""

    def __init__(self, path: str | os.PathLike, sync: bool = True):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_CLOEXEC", 0), 0o644)
        self._hash = new_hasher()
        self._size = 0
        self._written = 0  # bytes written so far (the offset of the next block)
        self._sync = sync

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        for start in range(0, len(view), _BLOCK):
            block = view[start:start + _BLOCK]
            if len(block) >= _OVERLAP:
                pending = _pool().submit(self._hash.update, block)  # the hash runs while the block is written
                try:
                    self._write(block)
                finally:
                    pending.result()
            else:
                self._hash.update(block)
                self._write(block)
        self._size += len(view)
        return len(view)

    def _write(self, block: memoryview) -> None:
        done = 0
        while done < len(block):
            done += os.write(self._fd, block[done:])
        if self._sync and len(block) >= _OVERLAP:
            _start_writeback(self._fd, self._written, len(block))
        self._written += len(block)

    def flush(self) -> None:  # torch.save flushes; the bytes are written already (no user-space buffer)
        pass

    def close(self) -> dict[str, Any]:
        """Flush to disk, close, and return {"size": bytes, ALGORITHM: hex digest}."""
        try:
            if self._sync:
                os.fsync(self._fd)
            st = os.fstat(self._fd)
        finally:
            os.close(self._fd)
            self._fd = -1
        entry = {"size": self._size, ALGORITHM: self._hash.hexdigest()}
        record = _record.get()
        if record is not None:
            record[str(self.path.resolve())] = {**entry, "_stat": _stat_key(st)}
        return entry

    def __enter__(self) -> "HashedFile":
        return self

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if kind is not None and self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


def torch_save(obj: Any, out: HashedFile) -> None:
    """`torch.save(obj, out)` without the zip format's CRC32 of every record: the file's checksum (computed while
    it is written, verified before it is read) covers the same bytes, and torch.load does not check CRC32s. Where
    torch's writer cannot be built that way (another torch version), plain torch.save."""
    import pickle

    import torch
    from torch import serialization

    try:
        writer = torch._C.PyTorchFileWriter(out, False, serialization._get_storage_alignment())
        save = serialization._save
    except (AttributeError, TypeError):  # pragma: no cover - a torch without these internals
        torch.save(obj, out)
        return
    save(obj, writer, pickle, serialization.DEFAULT_PROTOCOL, False)
    writer.write_end_of_file()


_writeback: list[Any] = []  # [sync_file_range or None], looked up once


def _start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask Linux to start writing a block to disk now (sync_file_range with SYNC_FILE_RANGE_WRITE, which does not
    wait), so that the fsync at the end finds little left to flush: measured here, writing 300 MB and fsyncing it
    took 0.10 s this way against 0.15 s with the fsync alone. Elsewhere, or where it fails, nothing happens."""
    if not _writeback:
        call = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                call = ctypes.CDLL(None, use_errno=True).sync_file_range
                call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
            except (OSError, AttributeError):
                call = None
        _writeback.append(call)
    if _writeback[0] is not None:
        _writeback[0](fd, offset, length, 2)  # SYNC_FILE_RANGE_WRITE; a failure only means no early start


# safetensors' dtype names (its format specification); other dtypes are written by the safetensors package
_DTYPES = {"bool": "BOOL", "uint8": "U8", "int8": "I8", "int16": "I16", "uint16": "U16", "int32": "I32",
           "uint32": "U32", "int64": "I64", "uint64": "U64", "float16": "F16", "bfloat16": "BF16", "float32": "F32",
           "float64": "F64", "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2"}


def writable_natively(tensors: dict[str, Any]) -> bool:
    """Whether `write_safetensors` handles every dtype here (contiguous CPU tensors are assumed)."""
    return all(str(t.dtype).removeprefix("torch.") in _DTYPES for t in tensors.values())


def write_safetensors(tensors: dict[str, Any], path: Path, metadata: dict[str, str] | None = None) -> dict[str, Any]:
    """Write contiguous CPU tensors as a safetensors file straight from their memory (no serialised copy), hashing
    while writing. Tensors are laid out by element size, largest first, so every tensor starts aligned."""
    order = sorted(tensors, key=lambda n: (-tensors[n].element_size(), n))
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    offset = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {"dtype": _DTYPES[str(t.dtype).removeprefix("torch.")], "shape": list(t.shape),
                        "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data start 8-byte aligned, as the safetensors package writes them
    with HashedFile(path, sync=is_recording()) as out:
        out.write(struct.pack("<Q", len(text)) + text)
        for name in order:
            t = tensors[name]
            if t.numel():
                import torch

                out.write(t.reshape(-1).view(torch.uint8).numpy())
        return out.close()


# ------------------------------------------------------------------------------------------ checking


def hash_file(path: Path, algorithm: str = ALGORITHM, sync: bool = False) -> str:
    """The hex checksum of a file (BLAKE3 memory-mapped, with its own threads for large files); with `sync`, the
    file is also flushed to disk."""
    hasher = new_hasher(algorithm)
    size = os.path.getsize(path)
    if algorithm == "blake3" and size:
        import blake3

        hasher = blake3.blake3(max_threads=blake3.blake3.AUTO if size >= _MANY_THREADS else 1)
        try:
            hasher.update_mmap(str(path))
        except (OSError, ValueError):  # a file system without mmap: read it
            hasher = new_hasher(algorithm)
            _read_into(hasher, path)
    elif size:
        _read_into(hasher, path)
    if sync:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return hasher.hexdigest()


def _read_into(hasher: Any, path: Path) -> None:
    with open(path, "rb") as fp:
        for block in iter(lambda: fp.read(1 << 22), b""):
            hasher.update(block)
