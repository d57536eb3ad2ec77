"""Reading only what lies inside a directory: the entries a checkpoint's manifest or a safetensors index names.

An entry is read only when it is a plain relative name (no `..`, no absolute path, no empty or `.` part, no NUL) and
what it names, once every symbolic link on the way is followed, is a regular file inside the directory. Anything
else is refused with a CheckpointError naming the entry and why: `load_state`, `load_checkpoint_and_dispatch` and
`acc merge-weights` read nothing outside the checkpoint they were given (the directory itself may be a link, e.g.
`ckpt/latest -> step-1000`; links inside it that stay inside are followed). A hard link cannot be told from a file
and is read. Torch-free.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from acc.errors import CheckpointError


def name_problem(name: object) -> str | None:
    """Why `name` is not a plain relative name inside a directory (None: it is one)."""
    if not isinstance(name, str) or not name:
        return "it is not a file name"
    if "\0" in name:
        return "it holds a NUL character"
    if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
        return "it is an absolute path"
    parts = name.replace("\\", "/").split("/")
    if ".." in parts:
        return "it climbs out of the directory with '..'"
    if any(p in ("", ".") for p in parts):
        return "it has an empty or '.' part"
    return None


def problem(directory: str | os.PathLike, name: object) -> str | None:
    """Why entry `name` of `directory` may not be read (None: it may; an entry that does not exist may, so that the
    caller says it is missing)."""
    why = name_problem(name)
    if why is not None:
        return why
    assert isinstance(name, str)
    root = os.path.realpath(directory)
    # walk the path that is read: a backslash separates only where the OS says so (on POSIX `a\b` is one name,
    # and checking `a/b` instead let a link named so point outside unchecked)
    current, parts = root, (name.replace("\\", "/") if os.sep == "\\" else name).split("/")
    for i, part in enumerate(parts):
        current = os.path.join(current, part)
        if os.path.islink(current):
            target = os.path.realpath(current)
            if not _within(target, root):
                shown = os.readlink(current)
                which = "it" if i == len(parts) - 1 else f"its part {'/'.join(parts[:i + 1])!r}"
                return (f"{which} is a symbolic link to {shown}" + (f" ({target})" if shown != target else "")
                        + ", outside the directory")
            current = target
    try:
        mode = os.stat(current).st_mode
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"it cannot be examined ({exc.strerror})"
    if not stat.S_ISREG(mode):
        kind = ("a directory" if stat.S_ISDIR(mode) else "a named pipe" if stat.S_ISFIFO(mode) else
                "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode)
                else "not a regular file")
        return f"it is {kind}, not a regular file"
    return None


def _within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def inside(directory: str | os.PathLike, name: object, listed_in: str | os.PathLike | None = None) -> Path:
    """`directory / name`, after checking that reading it reads only what lies inside `directory`; a CheckpointError
    naming the entry (and the manifest or index that lists it, `listed_in`) otherwise."""
    why = problem(directory, name)
    if why is not None:
        where = f" (listed in {listed_in})" if listed_in is not None else ""
        raise CheckpointError(f"{directory}: refused to read the entry {name!r}{where}: {why}; acc reads only "
                              "regular files inside the checkpoint directory it was given (copy the file into it, or "
                              "load it directly)")
    return Path(directory) / str(name)


__all__ = ["inside", "name_problem", "problem"]
