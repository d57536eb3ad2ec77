"""The `elastic` engine: workers started and watched by torch's elastic agent (what torchrun uses).

The agent owns process start, rendezvous, restarts, failure detection and shutdown; acc translates the
plan into a `LaunchConfig`, arranges the logs, and turns the agent's failure record into a short report.

Logs: every rank but local rank 0 writes its output to `<log dir>/<run>/attempt_<n>/<local rank>/`;
local rank 0 prints to the console as a plain process would. `tee` shows every rank on the console with
a `[rank N]` prefix. The report of a failed run quotes the failing rank's own traceback (from the error
file its Accelerator wrote), the tail of its log, and, for ranks the agent had to stop, where they were
(Python stacks dumped on SIGTERM).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from acc.contract.launch_plan import LaunchPlan, Target
from acc.launcher.processes import children

LOG_DIR_ENV = "ACC_LOG_DIR"
TEE_ENV = "ACC_TEE"
STACKS_FILE = "stacks.log"  # written next to a worker's error file when it receives SIGTERM
TAIL_LINES = 15


def launch_config(plan: LaunchPlan, log_dir: str, tee: bool, start_method: str = "spawn",
                  monitor_interval: float = 0.1) -> Any:
    """The torch `LaunchConfig` for `plan`; `monitor_interval` is the seconds between the agent's checks of its
    workers (the `monitor_interval` setting, torchrun's --monitor-interval)."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    rdzv = plan.rendezvous
    assert rdzv is not None, "an elastic plan needs a rendezvous"
    configs: dict = {"timeout": int(rdzv.timeout)}
    if rdzv.backend == "c10d":
        configs["is_host"] = plan.machine_rank == 0
        configs["join_timeout"] = int(rdzv.timeout)
    if rdzv.backend == "static":
        configs["rank"] = plan.machine_rank
    n = plan.nproc_per_machine
    if tee:
        logs = DefaultLogsSpecs(log_dir=log_dir, redirects=Std.ALL, tee=Std.ALL)
    else:  # local rank 0 keeps the console; the others write to their files only
        logs = DefaultLogsSpecs(log_dir=log_dir, redirects={r: (Std.NONE if r == 0 else Std.ALL) for r in range(n)})
    return LaunchConfig(
        min_nodes=plan.num_machines,
        max_nodes=plan.num_machines,
        nproc_per_node=n,
        logs_specs=logs,
        run_id=rdzv.run_id or (uuid.uuid4().hex if plan.num_machines == 1 else "acc"),
        role="worker",
        rdzv_endpoint=rdzv.endpoint or "127.0.0.1:0",
        rdzv_backend=rdzv.backend,
        rdzv_configs=configs,
        max_restarts=plan.max_restarts,
        monitor_interval=monitor_interval,
        start_method=start_method,
        log_line_prefix_template="[rank${rank}] " if tee else None,
    )


def _forward_sigusr1() -> None:
    """`kill -USR1 <launcher>` makes every worker print its Python stacks (faulthandler in each worker)."""

    def forward(signum: int, frame: Any) -> None:
        for pid in children(os.getpid()):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGUSR1, forward)


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str], replace: bool = True) -> int:
    """Start the plan's workers through `torch.distributed.launcher.api.elastic_launch`; return the exit code.
    Across machines, a roll call comes first and heartbeats run alongside (see machines.py)."""
    if not os.environ.get("ACC_DEBUG"):
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    log_dir = env.get(LOG_DIR_ENV) or tempfile.mkdtemp(prefix="acc-logs-")
    tee = env.get(TEE_ENV, "") == "1"
    os.environ.clear()  # workers inherit the launcher's environment: make it theirs
    os.environ.update(env)
    if target.no_python:  # a program, not a Python script: the agent starts it as a process of its own
        method, why = "spawn", "--no-python: the program is not Python, so it cannot be forked from this launcher"
    else:
        method, why = start_method(env.get(START_METHOD_ENV, "auto"), plan.max_restarts)
    if os.environ.get("ACC_DEBUG"):
        print(f"acc launch: start method {method} ({why})", file=sys.stderr)
    _forward_sigusr1()
    from acc.launcher import listen

    machines = store = None
    if plan.num_machines == 1:  # the store on loopback (or --listen-address), held until the workers ended
        plan, store = listen.serve_one_machine(plan)
        print(f"acc launch: listening: {listen.describe(plan, started=True)}", file=sys.stderr)
    config = launch_config(plan, log_dir, tee, method, _monitor_interval(env))
    if plan.num_machines > 1:
        from acc.launcher.machines import Machines, RendezvousTimeout

        machines = Machines(plan)
        try:
            machines.join()
        except RendezvousTimeout as exc:
            print(f"acc launch: {exc}", file=sys.stderr)
            return 1
        print(f"acc launch: {machines.describe()}", file=sys.stderr)
        print(f"acc launch: listening: {listen.describe(machines.plan, started=True)}", file=sys.stderr)
        machines.watch()
    try:
        return _run(config, method, target, log_dir, machines)
    finally:
        if machines is not None:
            machines.close()
        del store  # the one-machine store ends with the run


def _run(config: Any, method: str, target: Target, log_dir: str, machines: Any) -> int:
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    watcher = None
    try:
        if method == "fork":
            from acc.launcher.fork import ExitWatcher, run_target

            watcher = ExitWatcher()
            watcher.install()
            run_agent(elastic_launch(config, run_target), target.is_module, target.program, tuple(target.args))
        else:
            argv = target.argv(sys.executable)
            run_agent(elastic_launch(config, argv[0]), *argv[1:])
    except ChildFailedError as exc:
        log_dirs = rank_log_dirs(log_dir, config.run_id)
        exits = watcher.codes if watcher is not None else {}
        lost = machines.verdict() if machines is not None else None
        if lost:
            print(f"acc launch: {lost}; the workers here failed because of it:", file=sys.stderr)
        print(failure_report(exc, log_dirs, exits), file=sys.stderr)
        failures = _with_recorded(exc.failures, log_dirs, exits)
        code = failures[_root_rank(failures)].exitcode
        if machines is not None:
            machines.done(code)
        return code if code > 0 else 128 + abs(code)
    except SignalException as exc:
        if machines is not None and machines.lost:
            print(f"acc launch: {machines.lost}; the workers on this machine were stopped", file=sys.stderr)
            machines.done(1)
            return 1
        print(f"acc launch: stopped by {signal.Signals(exc.sigval).name}; every worker was stopped too",
              file=sys.stderr)
        if machines is not None:
            machines.done(128 + int(exc.sigval))
        return 128 + int(exc.sigval)
    if machines is not None:
        machines.done(0)
    return 0


def run_agent(launch: Any, *args: Any) -> Any:
    """`launch(*args)` (an `elastic_launch`), with a signal that stopped the agent raised as the agent's
    `SignalException` however torch passed it on. A signal that lands in torch's metric timer (`metrics.prof`)
    between its `try` and its clock read turns into an UnboundLocalError in that timer's `finally`, with the
    SignalException as its context: the workers were stopped all the same, and the caller must see the signal
    (KeyboardInterrupt in a notebook), not torch's slip."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError

    try:
        return launch(*args)
    except (SignalException, ChildFailedError):
        raise
    except Exception as exc:
        signalled = signal_behind(exc, SignalException)
        if signalled is None:
            raise
        raise signalled from None


def signal_behind(exc: BaseException, kind: type[BaseException]) -> BaseException | None:
    """The exception of type `kind` that `exc` was raised while handling (its context chain), or None."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, kind):
            return cause
        seen.add(id(cause))
        cause = cause.__context__
    return None


START_METHOD_ENV = "ACC_START_METHOD"


def _monitor_interval(env: Mapping[str, str]) -> float:
    """The `monitor_interval` setting of this launch (from the resolved settings handed to the workers)."""
    from acc.assembly import handoff
    from acc.errors import ConfigError

    try:
        handed = handoff.read(env)
    except ConfigError:
        handed = None
    value = handed.get("monitor_interval") if handed is not None else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else 0.1


def start_method(asked: str, max_restarts: int = 0) -> tuple[str, str]:
    """("fork" | "spawn", why). auto forks when it is safe: POSIX, no restarts asked for, and nothing in the
    launcher initialised CUDA or started threads (a plugin importing a library that does makes it fall back to
    spawn, saying why)."""
    if asked == "spawn":
        return "spawn", "spawn was asked for (--start-method / ACC_START_METHOD / start_method)"
    if os.name != "posix":
        return "spawn", "fork needs a POSIX system"
    if max_restarts:
        # a restart re-forks the launcher after the agent's rendezvous threads started: seen to hang or fail
        # to connect on torch 2.13, so restarts get fresh interpreters
        if asked == "fork":
            print("acc launch: --start-method fork is not used with --max-restarts; starting fresh interpreters",
                  file=sys.stderr)
        return "spawn", "restarts are asked for (a restarted round is started fresh)"
    from acc.launcher.fork import fork_unsafe_reason, preload

    preload()
    reason = fork_unsafe_reason()
    if reason is None:
        return "fork", "workers forked from this launcher, which imported torch once"
    if asked == "fork":
        print(f"acc launch: --start-method fork is unsafe here ({reason}); starting fresh interpreters (spawn)",
              file=sys.stderr)
    return "spawn", f"fork is unsafe: {reason}"


def _how(code: int) -> str:
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _root_order(failure: Any) -> tuple:
    """Sort key: what most likely failed first. A death by a signal the agent does not send (SIGKILL,
    SIGSEGV, ...) comes first, then exceptions by the time the worker recorded them, then the rest."""
    code, message = failure.exitcode, failure.message
    if code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
        return (0, 0)
    if isinstance(message, dict) and "acc_time_ns" in message.get("extraInfo", {}):
        return (1, int(message["extraInfo"]["acc_time_ns"]))
    return (2, failure.timestamp)


def _root_rank(failures: dict) -> int:
    return min(failures, key=lambda r: _root_order(failures[r]))


def _message(failure: Any) -> tuple[str, str]:
    message, callstack = failure.message, ""
    if isinstance(message, dict):
        callstack = message.get("extraInfo", {}).get("py_callstack", "")
        message = message.get("message", "")
    message = "" if "To enable traceback" in str(message) else str(message).strip()
    return message, callstack


def _tail(path: Path, lines: int = TAIL_LINES) -> list[str]:
    try:
        return [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()][-lines:]
    except OSError:
        return []


def _is_timeout(message: str) -> bool:
    lowered = message.lower()
    return "timed out" in lowered or "timeout" in lowered


def rank_log_dirs(log_dir: str, run_id: str) -> dict[int, Path]:
    """Local rank -> its log directory in the latest attempt (`<log_dir>/<run_id>_*/attempt_<n>/<rank>`)."""
    attempts = sorted(Path(log_dir).glob(f"{run_id}_*/attempt_*"), key=lambda p: int(p.name.split("_")[1]))
    if not attempts:
        return {}
    return {int(p.name): p for p in attempts[-1].iterdir() if p.is_dir() and p.name.isdigit()}


@dataclass
class _Recorded:
    """A failure known from a worker's error file only (the agent reports one failure per function-entrypoint run)."""

    local_rank: int
    message: Any
    exitcode: int = 1
    timestamp: int = 0
    error_file: str = ""


def _with_recorded(failures: dict, log_dirs: dict[int, Path], exits: dict[int, int] | None = None) -> dict:
    """The agent's failures plus every other local rank that left an error file or, forked, died by a signal
    (so the first failure is found even when the agent reported only one)."""
    import json

    from acc.launcher.fork import PID_FILE

    if not failures:
        return failures
    some_rank, some = next(iter(failures.items()))
    offset = some_rank - some.local_rank
    out = dict(failures)
    known = {f.local_rank for f in failures.values()}
    for local, directory in log_dirs.items():
        code = None
        try:
            code = (exits or {}).get(int((directory / PID_FILE).read_text()))
        except (OSError, ValueError):
            pass
        if code is not None and code < 0 and local in known:  # the agent's record lacks the signal: add it
            out[offset + local].exitcode = code
            continue
        if local in known:
            continue
        path = directory / "error.json"
        stacks = directory / STACKS_FILE
        if code is None and not path.is_file() and stacks.is_file() and stacks.stat().st_size:
            code = -signal.SIGTERM  # it dumped its stacks on SIGTERM: the agent stopped it
        if code is not None and code < 0:
            out[offset + local] = _Recorded(local, "", exitcode=code)
        elif path.is_file():
            try:
                message = json.loads(path.read_text()).get("message", "")
            except (OSError, ValueError):
                continue
            stamp = int(message.get("extraInfo", {}).get("timestamp", 0)) if isinstance(message, dict) else 0
            out[offset + local] = _Recorded(local, message, exitcode=code or 1, timestamp=stamp, error_file=str(path))
    return out


def failure_report(exc: Any, log_dirs: dict[int, Path] | None = None, exits: dict[int, int] | None = None) -> str:
    """The first failing rank with its own traceback and log tail, then one line per other failed rank."""
    log_dirs = log_dirs or {}
    failures = _with_recorded(exc.failures, log_dirs, exits)
    root_rank = _root_rank(failures)
    order = [root_rank] + [r for r in sorted(failures) if r != root_rank]
    lines = ["acc launch: the run failed"]
    timed_out, stopped = [], []
    for rank in order:
        failure = failures[rank]
        message, callstack = _message(failure)
        if _is_timeout(message):
            timed_out.append(rank)
        label = "first failure" if rank == root_rank else "also failed"
        lines.append(f"  rank {rank} (local rank {failure.local_rank}), {label}: {_how(failure.exitcode)}"
                     + (f": {message.splitlines()[-1]}" if message and rank != root_rank else ""))
        log_dir = log_dirs.get(failure.local_rank)
        if rank == root_rank:
            detail = callstack or message
            lines.extend("    " + line for line in detail.rstrip().splitlines())
            for stream in ("stdout.log", "stderr.log") if (log_dir and not callstack) else ():
                tail = _tail(log_dir / stream)
                if tail:
                    lines.append(f"    last lines of its {stream[:6]} ({log_dir / stream}):")
                    lines.extend("      " + line for line in tail)
        if log_dir and (log_dir / STACKS_FILE).is_file() and failure.exitcode == -signal.SIGTERM:
            stopped.append((rank, log_dir / STACKS_FILE))
    if timed_out:
        stuck = sorted(set(failures) - set(timed_out))
        lines.append(f"  a collective timed out on rank(s) {', '.join(map(str, timed_out))}"
                     + (f"; rank(s) {', '.join(map(str, stuck))} never reached it (see where they were below)"
                        if stuck else ""))
    for rank, path in stopped:
        try:
            stack = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
        except OSError:
            stack = []
        if stack:
            lines.append(f"  rank {rank} was here when it was stopped ({path}):")
            lines.extend("    " + line for line in stack[:12])  # faulthandler prints the most recent call first
    return "\n".join(lines)
