"""Tracebacks that read from the user's line to the error: the frames of pluggy and of acc's own dispatch hidden.

What a worker prints, records for the launcher's failure report (the elastic agent's error file), and what an
uncaught exception shows in a script that made an Accelerator, leave out (pytest's `__tracebackhide__` idea):

- the frames of pluggy (hook calling, wrappers);
- the frames of acc's kernel (the `acc` package: facade, hook dispatch, the launcher's runpy start);
- the frames of hook implementations (`acc_*` functions of plugins, e.g. a wrapper re-raising at its `yield`);
- Python's runpy frames, and any frame whose function sets `__tracebackhide__ = True`.

The frame that raised is always kept, as are the user's frames and those of every other library (torch's), in
their order. One line at the end says how many were hidden; `ACC_DEBUG=1` shows every frame. The exception object
keeps its full traceback (debuggers and `traceback.print_exc()` in the user's own code see everything).
"""

from __future__ import annotations

import os
import sys
import traceback
from types import TracebackType
from typing import Any

DEBUG_ENV = "ACC_DEBUG"
_ACC_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the acc package


def _pluggy_dir() -> str | None:
    module = sys.modules.get("pluggy")
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.abspath(path)) + os.sep if path else None


def showing_everything() -> bool:
    return bool(os.environ.get(DEBUG_ENV))


def is_hidden(tb: TracebackType) -> bool:
    """Whether this traceback entry's frame is dispatch (see the module's list)."""
    frame = tb.tb_frame
    code = frame.f_code
    filename = code.co_filename
    if filename in ("<frozen runpy>",) or filename.endswith(f"{os.sep}runpy.py"):
        return True
    if _asks_to_hide(frame):
        return True
    path = os.path.abspath(filename) if not filename.startswith("<") else filename
    if path.startswith(_ACC_DIR):
        return True
    pluggy = _pluggy_dir()
    if pluggy is not None and path.startswith(pluggy):
        return True
    return code.co_name.startswith("acc_") and code.co_name in _hook_names()


def _hook_names() -> frozenset[str]:
    """The names of acc's hook specifications (a plugin's function of one of these names is a hook implementation)."""
    if not _HOOKS:
        from acc.contract import hookspecs

        _HOOKS.append(frozenset(n for n in dir(hookspecs) if n.startswith("acc_")))
    return _HOOKS[0]


_HOOKS: list[frozenset[str]] = []


def _asks_to_hide(frame: Any) -> bool:
    try:
        return frame.f_locals.get("__tracebackhide__") is True
    except Exception:  # noqa: BLE001 - a frame whose locals cannot be read is not hidden for that
        return False


def trimmed(tb: TracebackType | None) -> tuple[TracebackType | None, int]:
    """A new traceback chain without the hidden entries (the last one, the frame that raised, always stays), and
    how many were left out. `tb` itself is not changed."""
    entries = []
    while tb is not None:
        entries.append(tb)
        tb = tb.tb_next
    if not entries:
        return None, 0
    kept = [e for e in entries[:-1] if not is_hidden(e)] + [entries[-1]]
    head: TracebackType | None = None
    for entry in reversed(kept):
        head = TracebackType(head, entry.tb_frame, entry.tb_lasti, entry.tb_lineno)
    return head, len(entries) - len(kept)


def format_exception(exc: BaseException) -> str:
    """The exception as Python prints it, its chained causes included, with hidden frames left out (everything with
    ACC_DEBUG=1)."""
    if showing_everything():
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    hidden = 0
    originals: list[tuple[BaseException, TracebackType | None]] = []
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:  # every exception of the chain gets its own trimmed traceback, restored afterwards
        current = todo.pop()
        if id(current) in seen:
            continue
        seen.add(id(current))
        originals.append((current, current.__traceback__))
        short, count = trimmed(current.__traceback__)
        hidden += count
        current.__traceback__ = short
        todo += [e for e in (current.__cause__, current.__context__) if e is not None]
    try:
        text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    finally:
        for current, original in originals:
            current.__traceback__ = original
    if hidden:
        text += (f"({hidden} frame{'s' if hidden != 1 else ''} of acc's dispatch and pluggy hidden; {DEBUG_ENV}=1 "
                 "shows every frame)\n")
    return text


def print_exception(exc: BaseException, file: Any = None) -> None:
    """Print `format_exception(exc)` to `file` (stderr)."""
    stream = sys.stderr if file is None else file
    try:
        stream.write(format_exception(exc))
        stream.flush()
    except Exception:  # noqa: BLE001 - never lose the report: fall back to Python's own
        traceback.print_exception(type(exc), exc, exc.__traceback__)


__all__ = ["format_exception", "is_hidden", "print_exception", "trimmed"]
