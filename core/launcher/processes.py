"""The processes of a launch as the operating system sees them: a process's children, descendants and state, read
from /proc (Linux). The elastic executor signals its workers through them; the machines' watch stops them; the fork
start method reaps its zombies. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state, parent pid, ...); None when `pid` is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def state(pid: int) -> str | None:
    """Process `pid`'s one-letter state (R running, S sleeping, Z zombie, ...); None when there is no such process."""
    fields = _stat(pid)
    return fields[0] if fields else None


def children(parent: int) -> list[int]:
    """The pids whose parent is `parent`, zombies included."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _stat(int(entry.name))
            if fields is not None and int(fields[1]) == parent:
                found.append(int(entry.name))
    return found


def descendants(root: int, children: Any) -> list[int]:
    """Every process below `root`, as `children` (a pid -> child pids function) finds them, parents first."""
    found, todo = [], [root]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found
