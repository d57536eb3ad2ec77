"""Bounded waits on the event a test waits for, instead of sleeping in a loop until it happened: paths appearing
or a directory's files changing (inotify), processes ending (pidfd), text on a pipe (select).

Each wait returns as soon as its event happens, or when its timeout passes, or (where it takes `ended`) when a
process it was given ends first; it says which, and the caller asserts. Linux, as the suite; the standard library
only, so that worker scripts use them too (tests/workers/common.py puts the repository on sys.path). Where the
kernel gives no inotify or pidfd, a wait checks every POLL seconds instead.
"""

from __future__ import annotations

import codecs
import ctypes
import ctypes.util
import os
import select
import subprocess
import time
from pathlib import Path
from typing import IO, Any, Callable, Iterable

POLL = 0.05  # seconds between two checks where there is no event to wait on

# inotify(7): what wakes a wait on a directory (a file created, written, moved in or out, removed; the directory
# itself removed or moved), and inotify_init1's flags (O_NONBLOCK and O_CLOEXEC's values)
_MASK = 0x2 | 0x4 | 0x8 | 0x40 | 0x80 | 0x100 | 0x200 | 0x400 | 0x800
_INIT_FLAGS = os.O_NONBLOCK | os.O_CLOEXEC
_libc: Any = None


def _inotify() -> Any:
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        except OSError:
            _libc = False
        if _libc and not (hasattr(_libc, "inotify_init1") and hasattr(_libc, "inotify_add_watch")):
            _libc = False
    return _libc


class _Changes:
    """An inotify instance on directories; one that does not exist yet is watched from its nearest existing
    ancestor, and again from itself once it exists (`update`)."""

    def __init__(self, directories: Iterable[str | os.PathLike[str]]):
        self.directories = [Path(d) for d in directories]
        libc = _inotify() if self.directories else None
        self.fd = libc.inotify_init1(_INIT_FLAGS) if libc else -1
        self._watched: set[tuple[str, int, int]] = set()
        self.complete = False  # every directory (or its ancestor) watched: a change wakes the wait

    def update(self) -> None:
        if self.fd < 0:
            return
        complete = True
        for directory in self.directories:
            target = directory
            while not target.is_dir() and target != target.parent:
                target = target.parent
            try:
                stat = target.stat()
            except OSError:
                complete = False
                continue
            key = (str(target), stat.st_dev, stat.st_ino)  # a directory replaced (renamed over) is watched anew
            if key not in self._watched:
                if _libc.inotify_add_watch(self.fd, os.fsencode(target), _MASK) < 0:
                    complete = False
                    continue
                self._watched.add(key)
        self.complete = complete

    def drain(self) -> None:
        try:
            while os.read(self.fd, 1 << 16):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)


def _pidfd(pid: int) -> int | None:
    """A descriptor that becomes readable when process `pid` ends (a zombie has ended); None if it has already."""
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        return None


def _running(pid: int) -> bool:
    from acc.launcher.processes import state

    return state(pid) not in (None, "Z", "X")


class _Ends:
    """What ends a wait early: processes (a Popen, or a pid) ending, descriptors (an object with fileno()) becoming
    readable."""

    def __init__(self, ended: Iterable[Any]):
        self.fds: list[int] = []
        self._own: list[int] = []
        self._pids: list[int] = []  # no pidfd here: checked every POLL seconds
        self.done = False
        for thing in ended:
            if hasattr(thing, "fileno"):
                self.fds.append(thing.fileno())
                continue
            if isinstance(thing, subprocess.Popen):
                if thing.poll() is not None:
                    self.done = True
                    continue
                thing = thing.pid
            try:
                fd = _pidfd(thing)
            except (AttributeError, OSError):  # no pidfd_open in this Python or kernel
                self._pids.append(thing)
                continue
            if fd is None:
                self.done = True
            else:
                self.fds.append(fd)
                self._own.append(fd)

    @property
    def polling(self) -> bool:
        return bool(self._pids)

    def check(self, readable: Iterable[int]) -> None:
        if set(readable) & set(self.fds) or not all(_running(pid) for pid in self._pids):
            self.done = True

    def close(self) -> None:
        for fd in self._own:
            os.close(fd)


def wait_until(predicate: Callable[[], object], timeout: float, *, changes_in: Iterable[str | os.PathLike[str]] = (),
               ended: Iterable[Any] = ()) -> bool:
    """Check `predicate` now, and again each time a file changes in one of the directories `changes_in` (created,
    written, moved, removed), until it holds: True. False when `timeout` seconds pass first, or when one of `ended`
    (a Popen or a pid: that process ends; an object with fileno(): it becomes readable) ends before it holds. With
    no `changes_in`, the predicate is checked every POLL seconds."""
    deadline = time.monotonic() + timeout
    changes, ends = _Changes(changes_in), _Ends(ended)
    try:
        while True:
            changes.update()  # before the check: a change after it wakes the wait below
            if predicate():
                return True
            if ends.done:
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if not changes.complete or ends.polling:
                left = min(left, POLL)
            watched = [changes.fd] if changes.fd >= 0 else []
            readable, _, _ = select.select(watched + ends.fds, [], [], left)
            if watched:
                changes.drain()
            ends.check(readable)
            if ends.done:
                return bool(predicate())
    finally:
        changes.close()
        ends.close()


def wait_for_paths(paths: Iterable[str | os.PathLike[str]], timeout: float, *, ended: Iterable[Any] = ()) -> bool:
    """Whether every one of `paths` exists within `timeout` seconds (False as soon as one of `ended` ends first:
    see wait_until)."""
    paths = [Path(p) for p in paths]
    return wait_until(lambda: all(p.exists() for p in paths), timeout, changes_in={p.parent for p in paths},
                      ended=ended)


def wait_for_text(paths: Iterable[str | os.PathLike[str]], timeout: float, *, ended: Iterable[Any] = (),
                  complete: Callable[[str], bool] = lambda text: bool(text.strip())) -> bool:
    """Whether every one of `paths` holds text that `complete` accepts (default: any) within `timeout` seconds: a
    file exists before its writer has written into it, so a reader that waited for the path alone can read ''.
    False as soon as one of `ended` ends first (see wait_until)."""
    paths = [Path(p) for p in paths]

    def written() -> bool:
        try:
            return all(complete(p.read_text()) for p in paths)
        except (OSError, ValueError):
            return False

    return wait_until(written, timeout, changes_in={p.parent for p in paths}, ended=ended)


def is_pid(text: str) -> bool:
    """Whether `text` is a process id, as a worker writes it (for wait_for_text)."""
    return text.strip().isdigit()


def is_json(text: str) -> bool:
    """Whether `text` is a whole JSON document (for wait_for_text)."""
    import json

    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def wait_for_exit(pids: Iterable[int], timeout: float) -> list[int]:
    """Wait until every process of `pids` has ended (a zombie has), at most `timeout` seconds: the ones still
    running then."""
    deadline = time.monotonic() + timeout
    fds: dict[int, int] = {}
    polled: list[int] = []
    try:
        for pid in pids:
            try:
                fd = _pidfd(pid)
            except (AttributeError, OSError):
                polled.append(pid)
                continue
            if fd is not None:
                fds[fd] = pid
        while True:
            polled = [pid for pid in polled if _running(pid)]
            left = deadline - time.monotonic()
            if not fds and not polled or left <= 0:
                return sorted([*fds.values(), *polled])
            readable, _, _ = select.select(list(fds), [], [], min(left, POLL) if polled else left)
            for fd in readable:
                del fds[fd]
                os.close(fd)
    finally:
        for fd in fds:
            os.close(fd)


def read_until(stream: IO[Any], text: str, timeout: float) -> str:
    """Read a process's pipe (`proc.stdout` or `proc.stderr` of a text-mode Popen) until `text` appears, the pipe
    ends, or `timeout` seconds pass: everything read (the caller checks that `text` is in it; what follows it is
    in it too, so add what `proc.communicate()` returns after it). Reads the descriptor itself, so nothing stays in
    the stream's buffer for communicate() to miss."""
    decoder = codecs.getincrementaldecoder(getattr(stream, "encoding", None) or "utf-8")(errors="replace")
    deadline = time.monotonic() + timeout
    fd, seen = stream.fileno(), ""
    while text not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        chunk = os.read(fd, 1 << 16)
        seen += decoder.decode(chunk, final=not chunk)
        if not chunk:
            break
    return seen.replace("\r\n", "\n")
