"""SLURM host lists (`node[01-03,07]`, `a1,b[2-3]`, `rack[1-2]-gpu[001-002]`), expanded as `scontrol show hostnames`
does: commas outside brackets separate items, each bracket holds ranges and single numbers, a range keeps the
zero padding of its first number, several brackets in one item multiply out (left to right, the rightmost fastest).
The count and the first host are computed without expanding (a list may name 10^5 nodes)."""

from __future__ import annotations

import re
from itertools import islice
from typing import Iterator

from acc.cluster import ClusterError

_BRACKET = re.compile(r"\[([^\[\]]*)\]")


def _items(text: str) -> list[str]:
    """The comma-separated items of a host list (commas inside brackets belong to the ranges)."""
    items, depth, current = [], 0, []
    for ch in text.strip():
        if ch == "[":
            depth += 1
            if depth > 1:
                raise ClusterError(f"host list {text!r} nests brackets")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ClusterError(f"host list {text!r} closes a bracket it did not open")
        if ch == "," and depth == 0:
            items.append("".join(current))
            current = []
        else:
            current.append(ch)
    if depth:
        raise ClusterError(f"host list {text!r} leaves a bracket open")
    items.append("".join(current))
    if any(not item for item in items):
        raise ClusterError(f"host list {text!r} has an empty entry")
    return items


def _ranges(body: str, text: str) -> list[tuple[int, int, int]]:
    """(first, last, width) of each range in one bracket."""
    out = []
    for part in body.split(","):
        lo, dash, hi = part.partition("-")
        hi = hi if dash else lo
        if not (lo.isdigit() and hi.isdigit()):
            raise ClusterError(f"host list {text!r}: [{body}] holds {part!r}, which is neither a number nor a range "
                               "like 01-04")
        if int(hi) < int(lo):
            raise ClusterError(f"host list {text!r}: range {part!r} runs backwards")
        out.append((int(lo), int(hi), len(lo)))
    return out


def _groups(item: str, text: str) -> list[str | list[tuple[int, int, int]]]:
    """An item as literal pieces and bracket ranges, in order."""
    pieces: list[str | list[tuple[int, int, int]]] = []
    end = 0
    for match in _BRACKET.finditer(item):
        pieces.append(item[end:match.start()])
        pieces.append(_ranges(match.group(1), text))
        end = match.end()
    pieces.append(item[end:])
    return pieces


def _expand(pieces: list, prefix: str = "") -> Iterator[str]:
    if not pieces:
        yield prefix
        return
    head, rest = pieces[0], pieces[1:]
    if isinstance(head, str):
        yield from _expand(rest, prefix + head)
        return
    for lo, hi, width in head:
        for number in range(lo, hi + 1):
            yield from _expand(rest, prefix + str(number).zfill(width))


def hosts(text: str) -> Iterator[str]:
    """Every host of the list, in order (lazily)."""
    for item in _items(text):
        yield from _expand(_groups(item, text))


def count(text: str) -> int:
    """How many hosts the list names."""
    total = 0
    for item in _items(text):
        size = 1
        for piece in _groups(item, text):
            if not isinstance(piece, str):
                size *= sum(hi - lo + 1 for lo, hi, _ in piece)
        total += size
    return total


def first_host(text: str) -> str:
    return next(hosts(text))


def expand(text: str, limit: int | None = None) -> list[str]:
    """The hosts as a list (at most `limit` of them)."""
    return list(islice(hosts(text), limit))


def tasks_per_node(text: str) -> list[tuple[int, int]]:
    """SLURM_TASKS_PER_NODE as (tasks, nodes) runs: `2(x3),1` is [(2, 3), (1, 1)]."""
    out = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match:
            raise ClusterError(f"tasks per node {text!r}: {part!r} is neither N nor N(xM)")
        out.append((int(match.group(1)), int(match.group(2) or 1)))
    return out
