"""How a worker ends: cleanly on success, with its own exit code and an error record on failure.

- An uncaught exception is printed, recorded in the elastic agent's error file (TORCHELASTIC_ERROR_FILE,
  torch's JSON format, so the launcher can show the failing rank's traceback), and the process exits
  with 1 right after the atexit handlers registered after the Accelerator ran, skipping the C++ teardown
  that can abort a process still holding communication state (which would hide the real exit code).
  KeyboardInterrupt ends the process by SIGINT, as Python does.
- A normal end without `end_training()` runs it at exit, so the process group is left cleanly.
"""

from __future__ import annotations

import atexit
import json
import os
import signal
import sys
import time
import traceback
import weakref
from typing import Any, Callable

_state = {"failed": None, "installed": False}


def record_error(etype: type, value: BaseException, tb: Any) -> None:
    """Write the exception to the elastic agent's error file, if the agent gave one."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": f"{etype.__name__}: {value}", "extraInfo": {
        "py_callstack": "".join(traceback.format_exception(etype, value, tb)),
        "timestamp": str(int(time.time())),
        "acc_time_ns": str(time.time_ns()),  # finer than torch's seconds: tells which rank failed first
    }}}
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError:
        pass


def install(on_normal_exit: Callable[[], None]) -> None:
    """Install the exception hook (once per process) and an exit handler that calls `on_normal_exit`."""
    if not _state["installed"]:
        _state["installed"] = True
        previous = sys.excepthook

        def excepthook(etype: type, value: BaseException, tb: Any) -> None:
            _state["failed"] = etype
            if not issubclass(etype, KeyboardInterrupt):
                record_error(etype, value, tb)
            previous(etype, value, tb)

        sys.excepthook = excepthook
        atexit.register(_exit_now_if_failed)
    ref = weakref.WeakMethod(on_normal_exit) if hasattr(on_normal_exit, "__self__") else (lambda: on_normal_exit)
    atexit.register(_normal_exit, ref)


def _normal_exit(ref: Callable[[], Callable[[], None] | None]) -> None:
    callback = ref()
    if _state["failed"] is not None or callback is None:
        return
    try:
        callback()
    except BaseException as exc:  # e.g. a peer never reached the final barrier: this run did not end well
        _state["failed"] = type(exc)
        traceback.print_exc()


def _exit_now_if_failed() -> None:
    failed = _state["failed"]
    if failed is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if issubclass(failed, KeyboardInterrupt):
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(1)
