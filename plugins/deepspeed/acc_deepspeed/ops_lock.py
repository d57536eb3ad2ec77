"""DeepSpeed's ops built at run time (on the CPU, `deepspeed_shm_comm`, built by `init_distributed` in every
process) are compiled under torch's cpp_extension lock file. A process killed while it builds (a timeout, a
SIGKILL, a stopped run) leaves the lock behind, and every later run then waits on it forever without a word.
Before DeepSpeed starts, acc removes such a lock when it is older than any build takes, and says so; a younger one
is waited on, as torch does, after a line saying what it waits for."""

from __future__ import annotations

import sys
import time
import warnings
from pathlib import Path

OPS = ("deepspeed_shm_comm",)
STALE_AFTER = 600.0  # seconds; building the op takes about a minute on 2 cores


def clear_stale_locks(ops: tuple[str, ...] = OPS, stale_after: float = STALE_AFTER, say: bool = True) -> list[Path]:
    """Remove the build locks of `ops` older than `stale_after` seconds; returns the locks removed."""
    from torch.utils.cpp_extension import _get_build_directory

    removed = []
    for name in ops:
        lock = Path(_get_build_directory(name, verbose=False)) / "lock"
        try:
            age = time.time() - lock.stat().st_mtime
        except OSError:
            continue
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
