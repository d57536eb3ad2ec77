"""Workers forked from the launcher: the user's program runs as `__main__` in a child of a process that has
already imported torch (and the chosen backend's plugin), so no worker pays that import again.

The child is made to look like `python SCRIPT ARGS` (or `python -m MODULE ARGS`): `sys.argv`, `sys.path[0]`,
`__name__ == "__main__"`, `__file__`, default signal dispositions. It ends the way a plain worker does:
an uncaught exception is printed, recorded in the elastic agent's error file and exits 1; `sys.exit(n)` exits n;
a normal end leaves the process group cleanly and returns to the agent's wrapper, which reports success.
"""

from __future__ import annotations

import os
import runpy
import signal
import sys
import threading
from typing import Any, Callable

from acc.launcher.processes import children, state
from acc.launcher.worker_memory import apply_threshold
from acc.runtime.tracebacks import print_exception

PID_FILE = "pid"


class ExitWatcher:
    """Records how each forked worker ended, as it ends (SIGCHLD), without reaping it (WNOWAIT): the agent
    reports only one failure of a run whose workers are functions, which may be a consequence (a peer's broken
    connection) rather than the cause (a worker killed by a signal). pid -> exit code (negative: signal)."""

    def __init__(self) -> None:
        self.codes: dict[int, int] = {}

    def install(self) -> None:
        signal.signal(signal.SIGCHLD, self._on_child)

    def _on_child(self, signum: int, frame: object) -> None:
        for pid in children(os.getpid()):
            if pid in self.codes or state(pid) != "Z":
                continue
            try:
                info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
            except ChildProcessError:
                continue
            if info is not None:
                killed = info.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
                self.codes[pid] = -info.si_status if killed else info.si_status


def fork_unsafe_reason() -> str | None:
    """Why forking this launcher would be unsafe now (None when it is safe)."""
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return "CUDA was initialised in the launcher"
    if threading.active_count() > 1:
        return f"the launcher runs {threading.active_count() - 1} other thread(s)"
    return None


def preload() -> None:
    """Import what every worker needs, once, before forking: torch. (acc's own modules are cheap and are
    imported in the children, in parallel, only by the scripts that use them.)"""
    import importlib

    for name in ("torch", "torch.distributed"):
        importlib.import_module(name)


def _apply_thread_share() -> None:
    """Give torch the worker's OMP_NUM_THREADS, as a fresh interpreter would read it at import: the launcher
    imported torch with its own environment (one thread per core), and N forked workers each keeping that
    count oversubscribe the cores."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    if value.isdigit() and int(value) > 0:
        import torch

        torch.set_num_threads(int(value))


def _become_worker() -> None:
    """What a forked worker does first, whatever it runs: stop the collector scanning the launcher's objects,
    tell the launcher its pid, take the default signal dispositions and its own thread share."""
    import gc

    gc.freeze()  # the launcher's objects: never collected here, and the collector stops scanning (and copying) them
    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # lets the launcher tell which rank a child that died by a signal was (see ExitWatcher)
        try:
            with open(os.path.join(os.path.dirname(error_file), PID_FILE), "w") as fp:
                fp.write(str(os.getpid()))
        except OSError:
            pass
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGCHLD):
        signal.signal(sig, signal.SIG_DFL)  # the agent's (and the launcher's) handlers belong to the launcher
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _apply_thread_share()
    apply_threshold()


def run_target(is_module: bool, program: str, args: tuple[str, ...]) -> None:
    """The function each forked worker runs (the elastic agent's entrypoint)."""
    _become_worker()
    sys.argv = [program, *args]

    def script() -> None:
        if is_module:
            sys.path[0] = os.getcwd()
            runpy.run_module(program, run_name="__main__", alter_sys=True)
        else:
            sys.path[0] = os.path.dirname(os.path.abspath(program))
            runpy.run_path(program, run_name="__main__")

    _run_as_worker(script)


def run_function(fn: Any, args: tuple) -> Any:
    """The entrypoint of a worker that runs a function (`acc.launch`, `notebook_launcher`): `fn(*args)` in a child
    forked from the calling process (so a function defined in a notebook cell, in `__main__` or as a closure runs
    without being pickled), ended as a script's worker ends. Its return value goes back to the caller through
    the agent; tensors in it come back on the CPU (a CUDA tensor would initialise CUDA in the caller)."""
    _become_worker()
    _streams_follow_redirects()
    _forget_the_callers_run()
    return _run_as_worker(lambda: _returnable(fn(*args)))


def _run_as_worker(body: Callable[[], Any]) -> Any:
    """Run a worker's body and end as a plain Python process would: `sys.exit(code)` is the exit code (a message
    given to it printed), Ctrl-C ends the process by SIGINT, any other exception is printed from the user's line on
    (runpy's, acc's and pluggy's frames left out) and recorded for the failure report. Returns the body's value
    (None after `sys.exit(0)`); on a failure the process exits here with its code, and nothing of the launcher's
    teardown runs in this child."""
    from acc.runtime import lifecycle

    code, value = 0, None
    try:
        value = body()
        lifecycle.finish()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        if code == 0:
            lifecycle.finish()
        elif not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
    except KeyboardInterrupt:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
        code = 1
    except BaseException as exc:  # noqa: BLE001 - the worker's own failure, reported as a plain worker would
        print_exception(exc)
        lifecycle.record_error(type(exc), exc, exc.__traceback__)
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    if code:
        os._exit(code)  # the agent sees the exit code
    return value


def _streams_follow_redirects() -> None:
    """Where the agent redirects a worker's output to its log files (every rank but local rank 0, or all with tee),
    point file descriptors 1 and 2 and `sys.stdout`/`sys.stderr` at them. The agent redirects the descriptor behind
    `sys.stdout`, which in a notebook kernel (or under pytest) is not 1: without this the notebook would show every
    rank's output, and a failure report could not quote a rank's own lines."""
    import io

    error_file = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not error_file:
        return
    for fd, name in ((1, "stdout"), (2, "stderr")):
        path = os.path.join(os.path.dirname(error_file), f"{name}.log")  # the agent's file for this rank, if any
        if not os.path.isfile(path):
            continue
        try:
            getattr(sys, name).flush()
        except (AttributeError, OSError, ValueError):
            pass
        target = os.open(path, os.O_WRONLY | os.O_APPEND)
        os.dup2(target, fd)
        os.close(target)
        setattr(sys, name, io.TextIOWrapper(io.FileIO(fd, "w", closefd=False), line_buffering=True,
                                            errors="backslashreplace"))


def _forget_the_callers_run() -> None:
    """A process that called acc.launch may hold a run of its own (an Accelerator made in a notebook cell, a
    previous in-process launch): the child starts without it, as a fresh worker would."""
    from acc.runtime import lifecycle

    lifecycle._state.clear()
    lifecycle._state.update({"failed": None, "installed": False})
    runtime = sys.modules.get("acc.runtime.worker")
    if runtime is not None:
        runtime._CURRENT["runtime"] = None


def _returnable(value: Any) -> Any:
    """`value` with its tensors on the CPU, checked to be picklable (it travels to the caller through a pipe)."""
    import pickle

    import torch

    def cpu(obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return obj.detach().cpu() if obj.device.type != "cpu" else obj
        if isinstance(obj, dict):
            return type(obj)((k, cpu(v)) for k, v in obj.items()) if type(obj) is dict else obj
        if isinstance(obj, (list, tuple)) and type(obj) in (list, tuple):
            return type(obj)(cpu(v) for v in obj)
        return obj

    value = cpu(value)
    try:
        pickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - any pickling failure means it cannot be returned
        raise TypeError(f"the launched function returned {type(value).__name__}, which cannot be sent back to the "
                        f"calling process ({type(exc).__name__}: {exc}); return plain data (numbers, strings, lists, "
                        "dicts, CPU tensors)") from None
    return value
