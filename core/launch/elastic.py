"""The `elastic` engine: workers started and watched by torch's elastic agent (what torchrun uses).

The agent owns process start, rendezvous, restarts and failure detection; acc only translates the plan
into a `LaunchConfig` and turns the agent's failure record into a short report.
"""

from __future__ import annotations

import os
import sys
import uuid
from typing import Mapping

from .plan import LaunchPlan, Target


def launch_config(plan: LaunchPlan) -> "object":
    """The torch `LaunchConfig` for `plan`."""
    from torch.distributed.launcher.api import LaunchConfig

    rdzv = plan.rendezvous
    assert rdzv is not None, "an elastic plan needs a rendezvous"
    configs: dict = {"timeout": 900}
    if rdzv.backend == "c10d":
        configs["is_host"] = plan.machine_rank == 0
    if rdzv.backend == "static":
        configs["rank"] = plan.machine_rank
    return LaunchConfig(
        min_nodes=plan.num_machines,
        max_nodes=plan.num_machines,
        nproc_per_node=plan.nproc_per_machine,
        run_id=rdzv.run_id or (uuid.uuid4().hex if plan.num_machines == 1 else "acc"),
        role="worker",
        rdzv_endpoint=rdzv.endpoint or "127.0.0.1:0",
        rdzv_backend=rdzv.backend,
        rdzv_configs=configs,
        max_restarts=plan.max_restarts,
        monitor_interval=0.1,
        start_method="spawn",
    )


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str]) -> int:
    """Start the plan's workers through `torch.distributed.launcher.api.elastic_launch`; return the exit code."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.launcher.api import elastic_launch

    # workers inherit the launcher's environment: make it theirs
    os.environ.clear()
    os.environ.update(env)
    argv = target.argv(sys.executable)
    try:
        elastic_launch(launch_config(plan), argv[0])(*argv[1:])
    except ChildFailedError as exc:
        print(failure_report(exc), file=sys.stderr)
        first = exc.get_first_failure()[1]
        return first.exitcode if first.exitcode > 0 else 128 + abs(first.exitcode)
    return 0


def _how(code: int) -> str:
    import signal

    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {signal.Signals(-code).name}"
    except ValueError:
        return f"killed by signal {-code}"


def _root_order(failure: "object") -> tuple:
    """Sort key: what most likely failed first. A death by a signal the agent does not send (SIGKILL,
    SIGSEGV, ...) comes first, then exceptions by the time the worker recorded them, then the rest."""
    import signal

    code = failure.exitcode  # type: ignore[attr-defined]
    message = failure.message  # type: ignore[attr-defined]
    if code < 0 and -code not in (signal.SIGTERM, signal.SIGINT):
        return (0, 0)
    if isinstance(message, dict) and "acc_time_ns" in message.get("extraInfo", {}):
        return (1, int(message["extraInfo"]["acc_time_ns"]))
    return (2, failure.timestamp)  # type: ignore[attr-defined]


def failure_report(exc: "object") -> str:
    """A short report: the first failing rank with its own traceback, then one line per other failed rank."""
    failures = exc.failures  # type: ignore[attr-defined]
    root_rank = min(failures, key=lambda r: _root_order(failures[r]))
    root = failures[root_rank]
    lines = ["acc launch: the run failed"]
    for rank, failure in [(root_rank, root)] + [(r, f) for r, f in sorted(failures.items()) if r != root_rank]:
        message, callstack = failure.message, ""
        if isinstance(message, dict):
            callstack = message.get("extraInfo", {}).get("py_callstack", "")
            message = message.get("message", "")
        message = "" if "To enable traceback" in str(message) else str(message).strip()
        label = "first failure" if rank == root_rank else "also failed"
        lines.append(f"  rank {rank} (local rank {failure.local_rank}), {label}: {_how(failure.exitcode)}"
                     + (f": {message.splitlines()[-1]}" if message and rank != root_rank else ""))
        if rank == root_rank:
            detail = callstack or message
            lines.extend("    " + line for line in detail.rstrip().splitlines())
    return "\n".join(lines)
