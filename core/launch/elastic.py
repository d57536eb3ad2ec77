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
from pathlib import Path
from typing import Any, Mapping

from .plan import LaunchPlan, Target

LOG_DIR_ENV = "ACC_LOG_DIR"
TEE_ENV = "ACC_TEE"
STACKS_FILE = "stacks.log"  # written next to a worker's error file when it receives SIGTERM
TAIL_LINES = 15


def launch_config(plan: LaunchPlan, log_dir: str, tee: bool) -> Any:
    """The torch `LaunchConfig` for `plan`."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, Std
    from torch.distributed.launcher.api import LaunchConfig

    rdzv = plan.rendezvous
    assert rdzv is not None, "an elastic plan needs a rendezvous"
    configs: dict = {"timeout": 900}
    if rdzv.backend == "c10d":
        configs["is_host"] = plan.machine_rank == 0
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
        monitor_interval=0.1,
        start_method="spawn",
        log_line_prefix_template="[rank${rank}] " if tee else None,
    )


def _forward_sigusr1() -> None:
    """`kill -USR1 <launcher>` makes every worker print its Python stacks (faulthandler in each worker)."""

    def forward(signum: int, frame: Any) -> None:
        for pid in _children(os.getpid()):
            try:
                os.kill(pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass

    signal.signal(signal.SIGUSR1, forward)


def _children(parent: int) -> list[int]:
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


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str], replace: bool = True) -> int:
    """Start the plan's workers through `torch.distributed.launcher.api.elastic_launch`; return the exit code."""
    from torch.distributed.elastic.multiprocessing import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    if not os.environ.get("ACC_DEBUG"):
        logging.getLogger("torch.distributed.elastic").setLevel(logging.CRITICAL)
    log_dir = env.get(LOG_DIR_ENV) or tempfile.mkdtemp(prefix="acc-logs-")
    tee = env.get(TEE_ENV, "") == "1"
    os.environ.clear()  # workers inherit the launcher's environment: make it theirs
    os.environ.update(env)
    _forward_sigusr1()
    argv = target.argv(sys.executable)
    config = launch_config(plan, log_dir, tee)
    try:
        elastic_launch(config, argv[0])(*argv[1:])
    except ChildFailedError as exc:
        print(failure_report(exc, rank_log_dirs(log_dir, config.run_id)), file=sys.stderr)
        code = exc.failures[_root_rank(exc.failures)].exitcode
        return code if code > 0 else 128 + abs(code)
    except SignalException as exc:
        print(f"acc launch: stopped by {signal.Signals(exc.sigval).name}; every worker was stopped too",
              file=sys.stderr)
        return 128 + int(exc.sigval)
    return 0


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
        return path.read_text(errors="replace").splitlines()[-lines:]
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


def failure_report(exc: Any, log_dirs: dict[int, Path] | None = None) -> str:
    """The first failing rank with its own traceback and log tail, then one line per other failed rank."""
    log_dirs = log_dirs or {}
    failures = exc.failures
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
        stack = [ln for ln in _tail(path, 40) if ln.strip()]
        if stack:
            lines.append(f"  rank {rank} was here when it was stopped ({path}):")
            lines.extend("    " + line for line in stack[-12:])
    return "\n".join(lines)
