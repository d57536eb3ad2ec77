"""Checkpoint files: crash-safe directories, a manifest with checksums, and loading that runs no code.

Protocol of `save_state(dir)`:
1. the main process creates `<parent>/.<name>.tmp-<id>` and tells the others;
2. the backend (`acc_save_checkpoint`) and the kernel write their files there, each process its own;
3. every process reports the size and checksum of what it wrote (computed while writing, hashed_io.py; each file
   is fsynced once); the main process writes `manifest.json` (files, sizes, checksums, the run's configuration),
   fsyncs the directory and renames it to `<name>` in one atomic step (then fsyncs the parent).
A process killed before step 3 leaves only a `.tmp-` directory, which nothing ever loads.

Loading checks every file against the manifest (missing, truncated, altered) before reading it, and
reads tensors with safetensors and everything else with `torch.load(weights_only=True)`: a file that
would make pickle run code is refused.

Failures while writing (a full disk, a worker that raises) are collective: every process learns of them, the
temporary directory is removed, nothing is published, and every process raises; a full disk is a
CheckpointError naming the directory, the bytes needed and the bytes free.

Which checkpoint `load_state()` loads with automatic naming (the fallback rule): the newest `checkpoint_<i>`
whose manifest is valid and whose files all verify (present, full size, same checksum) on every process. A newer
one that fails is skipped with a warning naming it, the file and the reason; if none verifies, the error lists
each one and why. An explicitly named checkpoint that fails is an error: nothing is loaded.
"""

from __future__ import annotations

import errno
import json
import os
import random
import re
import shutil
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from acc.checkpointing import hashed_io
from acc.errors import CheckpointError

MANIFEST = "manifest.json"
FORMAT = "acc-checkpoint/2"  # /2: file checksums are BLAKE3 ("blake3"); /1 (acc 0.1) recorded sha256
FORMATS = ("acc-checkpoint/1", FORMAT)  # what loading reads
AUTO_PREFIX = "checkpoint_"


@dataclass
class ProjectConfiguration:
    """Where a project keeps its checkpoints (names as in Accelerate).

    With `automatic_checkpoint_naming`, `save_state()` writes `project_dir/checkpoints/checkpoint_<i>`
    and keeps the newest `total_limit`; `load_state()` loads the newest complete one. `logging_dir` defaults to
    `project_dir`. `save_on_each_node` (checkpoints on machine-local disks) is refused by `save_state` on a run
    that spans several machines: acc's checkpoints are written by every process into one directory that every
    machine sees (on one machine it changes nothing).
    """

    project_dir: str | None = None
    logging_dir: str | None = None
    automatic_checkpoint_naming: bool = False
    total_limit: int | None = None
    iteration: int = 0
    save_on_each_node: bool = False

    def __post_init__(self) -> None:
        self.set_directories(self.project_dir)

    def set_directories(self, project_dir: str | None = None) -> None:
        """Set `project_dir`, and `logging_dir` to it when none was given (Accelerate's method)."""
        self.project_dir = None if project_dir is None else str(project_dir)
        if self.logging_dir is None:
            self.logging_dir = self.project_dir

    @property
    def checkpoints_dir(self) -> Path:
        if not self.project_dir:
            raise CheckpointError("automatic checkpoint naming needs a project_dir: "
                                  "Accelerator(project_config=ProjectConfiguration(project_dir=..., ...))")
        return Path(self.project_dir) / "checkpoints"


# ------------------------------------------------------------------------------------------ directories


def temporary_dir(final: Path) -> Path:
    return final.parent / f".{final.name}.tmp-{uuid.uuid4().hex[:12]}"


def is_complete(directory: Path) -> bool:
    return directory.is_dir() and not directory.name.startswith(".") and (directory / MANIFEST).is_file()


def automatic_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete automatically named checkpoints under `root`, oldest first."""
    found = []
    if root.is_dir():
        for path in root.iterdir():
            match = re.fullmatch(AUTO_PREFIX + r"(\d+)", path.name)
            if match and is_complete(path):
                found.append((int(match.group(1)), path))
    return sorted(found)


def publish(tmp: Path, final: Path) -> None:
    """Make `tmp` visible as `final` atomically (an existing `final` is replaced, then removed in the background)."""
    _fsync_dir(tmp)  # the files' directory entries (each file was fsynced when written)
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{uuid.uuid4().hex[:12]}"
        os.replace(final, old)
    os.replace(tmp, final)
    _fsync_dir(final.parent)  # the rename
    if old is not None:
        remove_later(old)


_removals: list[threading.Thread] = []


def remove_later(directory: Path) -> None:
    """Delete a hidden directory (a replaced or retired checkpoint) on a background thread: nothing loads it, and
    deleting hundreds of MB takes a while. The thread is not a daemon, so the process waits for it at exit;
    `finish_removals` waits for it earlier (the next save_state, end_training)."""
    thread = threading.Thread(target=shutil.rmtree, args=(directory,), kwargs={"ignore_errors": True},
                              name="acc-remove-checkpoint")
    thread.start()
    _removals.append(thread)


def finish_removals() -> None:
    """Wait until the directories given to `remove_later` in this process are deleted."""
    while _removals:
        _removals.pop().join()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def retire(directory: Path) -> None:
    """Delete a checkpoint so that it is never seen half-deleted: hidden by a rename first, then removed."""
    hidden = directory.parent / f".{directory.name}.del-{uuid.uuid4().hex[:12]}"
    try:
        os.replace(directory, hidden)
    except OSError:
        shutil.rmtree(directory, ignore_errors=True)
        return
    remove_later(hidden)


def remove_stale_temporaries(root: Path, upto: int) -> list[Path]:
    """Remove what killed saves left under `root`: `.checkpoint_<j>.tmp-*` (j <= upto) and `.*.del-*`/`.*.old-*`
    directories. Called by the main process after it published checkpoint_<upto>, when no other save of this run
    can be in progress."""
    removed = []
    if not root.is_dir():
        return removed
    for path in root.iterdir():
        match = re.fullmatch(r"\." + AUTO_PREFIX + r"(\d+)\.(tmp|del|old)-[0-9a-f]+", path.name)
        if match and (match.group(2) != "tmp" or int(match.group(1)) <= upto) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def total_size(manifest: dict[str, Any]) -> int:
    return sum(int(entry.get("size", 0)) for entry in manifest.get("files", {}).values())


_SPACE_ERRNOS = {errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)}


def is_disk_full(exc: BaseException, directory: Path, needed: int) -> bool:
    """Whether a write failed because the file system is full (torch.save's C++ writer says only "unexpected pos",
    so its failures count when the file system has less free space than the checkpoint needs)."""
    if isinstance(exc, OSError) and exc.errno in _SPACE_ERRNOS:
        return True
    text = str(exc)
    if "No space left" in text or "os error 28" in text or "Disk quota exceeded" in text:
        return True
    writer = "unexpected pos" in text or "PytorchStreamWriter" in text or "file write failed" in text
    return writer and free_bytes(directory) < max(needed, 1)


def free_bytes(directory: Path) -> int:
    try:
        return shutil.disk_usage(directory if directory.exists() else directory.parent).free
    except OSError:
        return -1


def disk_full_message(final: Path, tmp: Path, file: str, needed: int, how: str, previous: Path | None) -> str:
    free = free_bytes(final.parent)
    kept = (f"the previous checkpoint {previous} is complete and unchanged" if previous is not None
            else "no earlier checkpoint was touched")
    what = tmp / file if " " not in file else f"{file} in {tmp}"
    return (f"save_state: the file system of {final.parent} is full: writing {what} failed; the checkpoint "
            f"{final} needs about {needed} bytes ({how}) and {free} bytes are free there. Nothing was published: "
            f"{kept}, and the temporary directory {tmp} was removed. Free some space (older checkpoints are pruned "
            "by total_limit only after a new one is complete) or save elsewhere")


# ------------------------------------------------------------------------------------------ files


def digest(path: Path, sync: bool = False, algorithm: str = hashed_io.ALGORITHM) -> dict[str, Any]:
    """Size and checksum of a file (what the manifest records); with `sync`, also flush it to disk."""
    size = path.stat().st_size
    return {"size": size, algorithm: hashed_io.hash_file(path, algorithm, sync)}


def digest_many(directory: Path, names: list[str], sync: bool = False,
                record: dict[str, dict[str, Any]] | None = None,
                algorithm: str = hashed_io.ALGORITHM) -> dict[str, dict[str, Any]]:
    """`digest` of several files (hashed in parallel threads). A file in `record` (hashed and fsynced while it was
    written, and unchanged since) is not read again."""
    from concurrent.futures import ThreadPoolExecutor

    known = {n: hashed_io.recorded(record, directory / n) for n in names} if record else {}
    todo = [n for n in names if known.get(n) is None]
    if len(todo) <= 1:
        found = {name: digest(directory / name, sync, algorithm) for name in todo}
    else:
        with ThreadPoolExecutor(max_workers=min(4, len(todo), os.cpu_count() or 1)) as pool:
            found = dict(zip(todo, pool.map(lambda n: digest(directory / n, sync, algorithm), todo)))
    return {n: known.get(n) or found[n] for n in names}


def save_tensors(tensors: dict[str, torch.Tensor], path: Path, metadata: dict[str, str] | None = None) -> None:
    """Write a flat dict of tensors as safetensors (shared storage is copied: safetensors needs that). Inside
    `save_state` the file is hashed while written and fsynced once (hashed_io.py)."""
    seen: set[tuple[int, int]] = set()
    out = {}
    for name, t in tensors.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset()) if t.numel() else (id(t), 0)
        if key in seen or not t.is_contiguous():
            t = t.clone().contiguous()
        seen.add(key)
        out[name] = t.cpu() if t.device.type != "cpu" else t
    if hashed_io.writable_natively(out):
        hashed_io.write_safetensors(out, Path(path), metadata)
        return
    from safetensors.torch import save_file  # a dtype acc does not lay out itself: hashed after writing

    save_file(out, str(path), metadata=metadata)


def load_tensors(path: Path, device: Any = "cpu") -> dict[str, torch.Tensor]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device=str(device))
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable safetensors file ({exc})") from None


def save_object(obj: Any, path: Path) -> None:
    """Write tensors (moved to the CPU, so the file loads on any device) and plain data with torch.save."""
    from acc.runtime.ops import apply

    obj = apply(lambda t: t.detach().cpu() if t.device.type != "cpu" else t, obj)
    if not hashed_io.is_recording():
        torch.save(obj, path)
        return
    with hashed_io.HashedFile(path) as out:  # inside save_state: hashed while torch.save writes, fsynced once
        hashed_io.torch_save(obj, out)
        out.close()


def load_object(path: Path, map_location: Any = "cpu") -> Any:
    """Read what `save_object` wrote; anything that is not tensors and plain data is refused."""
    import pickle

    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointError(
            f"{path}: refused: the file holds Python objects other than tensors and plain data, and loading "
            f"them would run code from the file ({str(exc).splitlines()[0]})"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: cannot be read: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None


# ------------------------------------------------------------------------------------------ manifest


def read_manifest(directory: Path) -> dict[str, Any]:
    path = directory / MANIFEST
    if not directory.is_dir():
        raise CheckpointError(f"checkpoint {directory} does not exist")
    _confine().inside(directory, MANIFEST)  # a manifest.json that links out of the checkpoint is refused
    if not path.is_file():
        raise CheckpointError(f"{directory} is not a complete acc checkpoint: it has no {MANIFEST} "
                              "(a checkpoint written by acc gets one when it is complete)")
    try:
        manifest = json.loads(path.read_text())
    except (ValueError, OSError, RecursionError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({type(exc).__name__}: {str(exc)[:200]})") from None
    if not isinstance(manifest, dict) or manifest.get("format") not in FORMATS:
        raise CheckpointError(f"{path}: not an acc checkpoint manifest (format {manifest.get('format')!r}, "
                              f"expected one of {', '.join(map(repr, FORMATS))})" if isinstance(manifest, dict) else
                              f"{path}: not an acc checkpoint manifest (a JSON {type(manifest).__name__}, expected "
                              "an object)")
    problem = manifest_problem(manifest)
    if problem:
        raise CheckpointError(f"{path}: not a valid acc checkpoint manifest: {problem}")
    return manifest


_HEX64 = re.compile(r"[0-9a-f]{64}")  # sha256 and blake3 (its default 32-byte output)


def manifest_problem(manifest: dict[str, Any]) -> str | None:
    """What is wrong with a manifest's structure (None: nothing): the files it lists (safe relative names, sizes,
    checksums), the run record and the step."""
    files = manifest.get("files")
    expected = "blake3" if manifest.get("format") == FORMAT else "sha256"
    if not isinstance(files, dict):
        return f"'files' must map file names to their size and {expected}, got {type(files).__name__}"
    for name, entry in files.items():
        parts = name.replace("\\", "/").split("/")
        if not name or name.startswith("/") or any(p in ("", ".", "..") for p in parts) or "\0" in name:
            return f"file name {name!r} is not a plain name inside the checkpoint"
        if not isinstance(entry, dict):
            return f"the entry of {name!r} must be an object with size and {expected}, got {type(entry).__name__}"
        size, sha = entry.get("size"), entry.get(expected)
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size < 2**63:
            return f"the size of {name!r} must be a byte count, got {size!r}"[:300]
        if not isinstance(sha, str) or not _HEX64.fullmatch(sha):
            return f"the {expected} of {name!r} must be 64 hex digits, got {sha!r}"[:300]
    run = manifest.get("run", {})
    if not isinstance(run, dict) or not isinstance(run.get("processes", {}), dict):
        return "'run' must be an object (the run's record) with 'processes' an object"
    world = run.get("processes", {}).get("num_processes")
    if world is not None and (not isinstance(world, int) or isinstance(world, bool)):
        return f"'run.processes.num_processes' must be an integer, got {world!r}"[:300]
    if not isinstance(run.get("backend", ""), str):
        return f"'run.backend' must be a string, got {run.get('backend')!r}"[:300]
    step = manifest.get("step", 0)
    if not isinstance(step, int) or isinstance(step, bool):
        return f"'step' must be an integer, got {step!r}"[:300]
    return None


def verify_all(directory: Path, manifest: dict[str, Any], names: list[str]) -> None:
    """Check every file in `names` against the manifest (hashed in parallel); the first bad one is an error."""
    verify_ahead(directory, manifest, names)
    for name in names:
        verify(directory, manifest, name)


def verify_ahead(directory: Path, manifest: dict[str, Any], names: list[str]) -> None:
    """Check several files at once (in parallel); later `verify` calls for them cost nothing."""
    present = [n for n in names if n in manifest.get("files", {}) and _confine().problem(directory, n) is None
               and (directory / n).is_file()
               and (directory / n).stat().st_size == manifest["files"][n]["size"]]
    verified = manifest.setdefault("_verified", {})
    for name, found in digest_many(directory, present, algorithm=_algorithm(manifest)).items():
        verified[name] = found[_algorithm(manifest)]


def _algorithm(manifest: dict[str, Any]) -> str:
    """The checksum a manifest's entries carry: blake3 from format /2 on, sha256 in /1."""
    return "sha256" if manifest.get("format") == FORMATS[0] else hashed_io.ALGORITHM


def verify(directory: Path, manifest: dict[str, Any], name: str) -> Path:
    """The path of `name` after checking it against the manifest (present, full size, same checksum)."""
    entry = manifest.get("files", {}).get(name)
    path = directory / name
    if entry is None:
        raise CheckpointError(f"{path}: not listed in {directory / MANIFEST}; the checkpoint does not match "
                              "what is being loaded (different models/optimizers, or another backend?)")
    _confine().inside(directory, name, directory / MANIFEST)  # only regular files inside the checkpoint are read
    if not path.is_file():
        raise CheckpointError(f"{path}: missing (listed in the manifest)")
    size = path.stat().st_size
    if size != entry["size"]:
        raise CheckpointError(f"{path}: truncated or altered: {size} bytes, the manifest says {entry['size']}")
    algorithm = _algorithm(manifest)
    known = manifest.get("_verified", {}).get(name)
    if (known or hashed_io.hash_file(path, algorithm)) != entry.get(algorithm):
        raise CheckpointError(f"{path}: corrupt: its {algorithm} checksum differs from the manifest's")
    return path


# ------------------------------------------------------------------------------------------ RNG


def rng_state() -> dict[str, Any]:
    """This process's random generator states, as tensors and plain data."""
    state: dict[str, Any] = {"python": _plain(random.getstate()), "torch": torch.get_rng_state()}
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, torch.from_numpy(keys.astype("int64")), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if torch.backends.mps.is_available():
        state["mps"] = torch.mps.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(_tuples(state["python"]))
    torch.set_rng_state(state["torch"])
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, keys.numpy().astype("uint32"), pos, has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "mps" in state and torch.backends.mps.is_available():
        torch.mps.set_rng_state(state["mps"])


def _plain(x: Any) -> Any:
    return [_plain(v) for v in x] if isinstance(x, (tuple, list)) else x


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


def _confine() -> Any:
    """acc.checkpointing.confine: entries are read only when they are regular files inside the checkpoint (no links out)."""
    from acc.checkpointing import confine

    return confine
