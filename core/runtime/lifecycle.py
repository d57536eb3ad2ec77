"""How a worker ends: cleanly on success, with its own exit code and an error record on failure.

- An uncaught exception is printed (without the frames of pluggy and of acc's dispatch, `acc.runtime.tracebacks`;
  ACC_DEBUG=1 shows them), recorded in the elastic agent's error file (TORCHELASTIC_ERROR_FILE,
  torch's JSON format, so the launcher can show the failing rank's traceback), and the process exits
  with 1 right after the atexit handlers registered after the Accelerator ran, skipping the C++ teardown
  that can abort a process still holding communication state (which would hide the real exit code).
  KeyboardInterrupt ends the process by SIGINT, as Python does.
- A normal end without `end_training()` runs it at exit, so the process group is left cleanly.

Every process-wide side effect of a worker (the exception hook, exit handlers, stack dumps on SIGUSR1/SIGTERM,
PR_SET_PDEATHSIG) is installed here, by `install`; the facade and the trackers only register callbacks.
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
        "py_callstack": _formatted(etype, value, tb),  # from the user's line on (acc.runtime.tracebacks)
        "timestamp": str(int(time.time())),
        "acc_time_ns": str(time.time_ns()),  # finer than torch's seconds: tells which rank failed first
    }}}
    try:
        with open(path, "w") as fp:
            json.dump(data, fp)
    except OSError:
        pass


def _formatted(etype: type, value: BaseException, tb: Any) -> str:
    from acc.runtime.tracebacks import format_exception

    if value is None or value.__traceback__ is not tb:
        return "".join(traceback.format_exception(etype, value, tb))
    return format_exception(value)


def install(on_normal_exit: Callable[[], None], also_on_failure: bool = False) -> None:
    """Install the exception hook (once per process) and an exit handler that calls `on_normal_exit`
    (`also_on_failure`: after an uncaught exception too, before the process exits; trackers close their logs)."""
    if not _state["installed"]:
        _state["installed"] = True
        previous = sys.excepthook

        def excepthook(etype: type, value: BaseException, tb: Any) -> None:
            _state["failed"] = etype
            if not issubclass(etype, KeyboardInterrupt):
                record_error(etype, value, tb)
            if previous is sys.__excepthook__ and not issubclass(etype, KeyboardInterrupt):
                sys.stderr.write(_formatted(etype, value, tb))  # without acc's and pluggy's frames (ACC_DEBUG=1: all)
            else:
                previous(etype, value, tb)

        sys.excepthook = excepthook
        atexit.register(_exit_now_if_failed)
        _install_stack_dumps()
        _die_with_the_launcher()
    ref = weakref.WeakMethod(on_normal_exit) if hasattr(on_normal_exit, "__self__") else (lambda: on_normal_exit)
    atexit.register(_normal_exit, ref, also_on_failure)
    _state.setdefault("callbacks", []).append(ref)


def finish() -> None:
    """Run the normal-end callbacks now (a forked worker ends with os._exit, which skips atexit)."""
    for ref in _state.get("callbacks", []):
        _normal_exit(ref)
    _state["callbacks"] = []


def _die_with_the_launcher() -> None:
    """Under the elastic agent, ask Linux to send this worker SIGTERM if the launcher dies (even by SIGKILL),
    so no worker of a run outlives it."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() == 1:  # the launcher was already gone before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _install_stack_dumps() -> None:
    """`kill -USR1` prints every thread's Python stack to stderr. Under the elastic agent, SIGTERM (how
    the agent stops a worker, e.g. one stuck in a collective) also writes them to stacks.log next to the
    error file, so the launcher's report can say where that worker was."""
    import faulthandler

    try:
        faulthandler.register(signal.SIGUSR1, file=sys.stderr, all_threads=True, chain=False)
    except (AttributeError, ValueError, OSError):  # no SIGUSR1 (Windows) or stderr without a file descriptor
        pass
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:
        try:
            stacks = open(os.path.join(os.path.dirname(error_file), "stacks.log"), "w")  # noqa: SIM115
            _state["stacks"] = stacks  # kept open for the life of the process
            faulthandler.register(signal.SIGTERM, file=stacks, all_threads=True, chain=True)
        except (OSError, ValueError):
            pass


def fail(code: int = 1) -> None:
    """End this process now with `code`, without waiting for the others at exit (they fail fast once it
    is gone). For code that detects a failure on one process only."""
    _state["failed"] = SystemExit
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def _normal_exit(ref: Callable[[], Callable[[], None] | None], also_on_failure: bool = False) -> None:
    callback = ref()
    if (_state["failed"] is not None and not also_on_failure) or callback is None:
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
