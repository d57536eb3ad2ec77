"""DeepSpeed's ops built at run time (on the CPU, `deepspeed_shm_comm`, built by `init_distributed` in every
process) are compiled under torch's cpp_extension lock file, which every process takes, even just to find the op
built already. A process killed while it holds it (a timeout, a SIGKILL, a stopped run) leaves the lock behind, and
every later run then waits on it forever without a word.

acc's processes take the op's lock only inside `building` (`load_ops` loads the op there, before
`init_distributed`, which then finds it loaded; not around init_distributed itself, whose shared-memory set-up
waits for every local rank): an advisory lock (flock) on a file beside torch's, which
the kernel releases when its holder dies. Whoever holds it knows that no other acc process is inside torch's lock,
so a torch lock found then was left by a process that died holding it, however recent: it is removed, saying so.
A lock older than any build takes is removed in any case (one left by a process that was not acc's)."""

from __future__ import annotations

import contextlib
import sys
import time
import warnings
from pathlib import Path
from typing import Iterator

OPS = ("deepspeed_shm_comm",)
STALE_AFTER = 600.0  # seconds; building the op takes about a minute on 2 cores


@contextlib.contextmanager
def building(ops: tuple[str, ...] = OPS, say: bool = True) -> Iterator[list[Path]]:
    """Around the code that loads (and if need be builds) `ops`: one acc process at a time, a lock that a dead
    process left removed first; yields the locks removed. Where flock is missing (not POSIX), only the age rule."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows: DeepSpeed's CPU ops are not built there
        yield clear_stale_locks(ops, say=say)
        return
    with contextlib.ExitStack() as held:
        for name in ops:
            directory = _build_directory(name)
            directory.mkdir(parents=True, exist_ok=True)
            guard = held.enter_context(open(directory / "lock.acc", "a"))
            fcntl.flock(guard.fileno(), fcntl.LOCK_EX)  # waits for an acc process loading the op now
        yield [lock for name in ops if (lock := _remove_left(name)) is not None] + clear_stale_locks(ops, say=say)


def load_ops(say: bool = True) -> None:
    """Load DeepSpeed's run-time-built CPU op (`deepspeed_shm_comm`) inside `building`; DeepSpeed keeps loaded ops,
    so `init_distributed` takes no lock for it afterwards. Nothing where the accelerator has no such op."""
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("ShareMemCommBuilder")
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return
    with building(say=say):
        builder.load(verbose=False)


def _build_directory(name: str) -> Path:
    """Where torch's cpp_extension builds op `name` (and keeps its lock file)."""
    from torch.utils.cpp_extension import _get_build_directory

    return Path(_get_build_directory(name, verbose=False))


def _lock_age(name: str) -> tuple[Path, float] | None:
    """Torch's build lock of op `name` and its age in seconds, or None when there is none."""
    lock = _build_directory(name) / "lock"
    try:
        return lock, time.time() - lock.stat().st_mtime
    except OSError:
        return None


def _remove_left(name: str) -> Path | None:
    """Under `building`'s flock: remove torch's lock of `name` unless it is older than STALE_AFTER (then the age
    rule speaks), as no live acc process holds it. Said by whichever process removes it."""
    found = _lock_age(name)
    if found is None or found[1] > STALE_AFTER:
        return None
    lock, age = found
    try:
        lock.unlink()
    except OSError:
        return None
    warnings.warn(f"removed {lock}: a build lock of DeepSpeed's {name} op taken {age:.0f} s ago by an acc process "
                  "that ended while holding it (DeepSpeed would have waited on it forever)", stacklevel=3)
    return lock


def clear_stale_locks(ops: tuple[str, ...] = OPS, stale_after: float = STALE_AFTER, say: bool = True) -> list[Path]:
    """Remove the build locks of `ops` older than `stale_after` seconds; returns the locks removed."""
    removed = []
    for name in ops:
        found = _lock_age(name)
        if found is None:
            continue
        lock, age = found
        if age <= stale_after:
            if say:
                print(f"acc: waiting for DeepSpeed's build of {name} ({lock}, taken {age:.0f} s ago by another "
                      "process); if no process is building it, remove that file", file=sys.stderr)
            continue
        try:
            lock.unlink()
        except FileNotFoundError:  # another process of this run removed it first
            continue
        removed.append(lock)
        if say:
            warnings.warn(f"removed {lock}: a build lock of DeepSpeed's {name} op left {age / 60:.0f} min ago by a "
                          "process that ended while building it (DeepSpeed would have waited on it forever)",
                          stacklevel=2)
    return removed
