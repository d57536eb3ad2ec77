"""How workers' memory allocator treats freed tensors (the `worker_memory` setting).

keep (the default): glibc's own behaviour. Blocks freed by a tensor go back to the heap for reuse, and
glibc's mmap threshold rises with the sizes it sees (up to 32 MiB), so after a few steps most tensors live
in the heap and a process's RSS stays at its high-water mark.

huge_pages (auto, the default, or off) applies to both: with auto, workers' malloc asks for transparent huge pages
(GLIBC_TUNABLES glibc.malloc.hugetlb=1) where the kernel offers them, so fresh memory comes 2 MiB at a time.
Fresh pages are not rare even with keep: a sharded step allocates and frees each unit's gathered parameters and
gradients, and glibc trims the heap's top. Measured on the sharded bench model (2 processes, init_module, keep):
page faults per step ddp 93k -> 0.7k, fsdp 79k -> 5.5k; step ddp 0.655 -> 0.549 s, fsdp 0.768 -> 0.612 s; fsdp's
peak RSS 1005 -> 1129 MB (whole 2 MiB pages resident), ddp's 1395 -> 1398 MB.

release: freed tensors leave the process at once, so RSS follows live memory, which is what sharding saves.
Two glibc knobs, read when a process starts: the mmap threshold fixed at 64 KiB (MALLOC_MMAP_THRESHOLD_: every
larger block is its own mapping, returned on free) and transparent huge pages for those mappings
(GLIBC_TUNABLES glibc.malloc.hugetlb=1, glibc 2.35+, with THP in madvise or always mode), so the pages a fresh
block touches come 2 MiB at a time rather than 4 KiB. Measured on the sharded bench model (fsdp, 2 processes):
the fixed threshold alone took the step from 1.06 s to 1.68-1.77 s (page faults on every all-gather); with
huge pages it was 1.13-1.19 s, at the same peak RSS (726 MB against 1059 MB kept).

Forked workers inherit the launcher's allocator, which read its knobs when the launcher started: `acc launch`
therefore starts itself again with them (`reexec_for`) before it forks. Workers `acc.launch(fn)` forks from a
notebook's interpreter get the fixed threshold (`apply_threshold`: glibc's mallopt works at any time) but not the
huge pages, which glibc reads only at start-up (`forked_without_huge_pages` says so); spawned ones get both.
"""

from __future__ import annotations

import os
import sys
from typing import Mapping, NoReturn

MODES = ("keep", "release")
THRESHOLD = "65536"
HUGE_PAGES = "glibc.malloc.hugetlb=1"
_REEXEC_ENV = "ACC_REEXEC_WORKER_MEMORY"


def environment(mode: str, base: Mapping[str, str], huge_pages: str = "auto") -> dict[str, str]:
    """The variables `mode` and `huge_pages` set in the workers' environment (a variable the user set is kept):
    release fixes the mmap threshold; huge_pages auto asks for huge pages where the kernel offers them."""
    if not sys.platform.startswith("linux"):
        return {}
    extra = {}
    if mode == "release" and "MALLOC_MMAP_THRESHOLD_" not in base:
        extra["MALLOC_MMAP_THRESHOLD_"] = THRESHOLD
    tunables = base.get("GLIBC_TUNABLES", "")
    if huge_pages == "auto" and huge_pages_mode() in ("always", "madvise") and "glibc.malloc.hugetlb" not in tunables:
        extra["GLIBC_TUNABLES"] = f"{tunables}:{HUGE_PAGES}" if tunables else HUGE_PAGES
    return extra


def huge_pages_mode() -> str | None:
    """The kernel's transparent huge page mode: always, madvise (only for mappings that ask), never; None if
    there is none (not Linux)."""
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled") as fp:
            text = fp.read()
    except OSError:
        return None
    return text[text.index("[") + 1:text.index("]")] if "[" in text else None


def reexec_for(mode: str, huge_pages: str = "auto") -> None:
    """Start this `acc` command again with the variables of `mode` and `huge_pages` when this process lacks them
    (its forked workers inherit its allocator); returns when nothing is needed. Never more than once."""
    extra = environment(mode, os.environ, huge_pages)
    if not extra or os.environ.get(_REEXEC_ENV) or not _is_acc_command():
        return
    _exec({**os.environ, **extra, _REEXEC_ENV: "1"})


def _is_acc_command() -> bool:
    """Whether this process is the `acc` command (its script, or `python -m acc`): only that is started again. A
    program that calls acc's click command in its own process (a test's CliRunner) is left running; its forked
    workers then get the mmap threshold (apply_threshold) but not the huge pages."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    return os.path.basename(sys.argv[0]) == "acc" or (spec is not None and spec.name in ("acc", "acc.__main__"))


def apply_threshold() -> None:
    """In a forked worker: fix glibc's mmap threshold at MALLOC_MMAP_THRESHOLD_ of the worker's environment, as a
    fresh interpreter would read it (a no-op where it is unset, or where this is not glibc)."""
    value = os.environ.get("MALLOC_MMAP_THRESHOLD_", "")
    if not value.isdigit() or not sys.platform.startswith("linux"):
        return
    import ctypes

    try:
        libc = ctypes.CDLL(None)
        libc.mallopt(-3, int(value))  # M_MMAP_THRESHOLD (also stops glibc from raising it)
    except (OSError, AttributeError):
        pass


def forked_without_huge_pages(worker_env: Mapping[str, str]) -> bool:
    """Whether workers forked from this process now miss the huge pages `worker_env` asks for (this process did
    not start with them: a notebook or script calling acc.launch)."""
    return HUGE_PAGES in worker_env.get("GLIBC_TUNABLES", "") and \
        "glibc.malloc.hugetlb" not in os.environ.get("GLIBC_TUNABLES", "") and \
        worker_env.get("MALLOC_MMAP_THRESHOLD_") == THRESHOLD  # release: every fresh block pays for it


def _exec(env: dict[str, str]) -> NoReturn:
    sys.stdout.flush()
    sys.stderr.flush()
    program = sys.argv[0]
    if os.path.basename(program) != "__main__.py" and os.access(program, os.X_OK):  # the `acc` script: its name
        os.execve(program, sys.argv, env)  # stays the command the run manifest records
    os.execve(sys.executable, [sys.executable, "-m", "acc", *sys.argv[1:]], env)
