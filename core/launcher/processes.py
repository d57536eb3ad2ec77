"""The processes of a launch as the operating system sees them: a process's children and descendants, read from
/proc (Linux). The elastic executor signals its workers through them; the machines' watch stops them. Torch-free.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def children(parent: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == parent:
                found.append(int(entry.name))
    return found


def descendants(root: int, children: Any) -> list[int]:
    found, todo = [], [root]
    while todo:
        for child in children(todo.pop()):
            found.append(child)
            todo.append(child)
    return found
