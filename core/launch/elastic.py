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


def failure_report(exc: "object") -> str:
    """A short report of failed workers: rank, exit code or signal, and the error the worker recorded."""
    import signal

    lines = ["acc launch: the run failed"]
    for rank, failure in sorted(exc.failures.items()):  # type: ignore[attr-defined]
        code = failure.exitcode
        if code < 0:
            try:
                how = f"killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"killed by signal {-code}"
        else:
            how = f"exit code {code}"
        lines.append(f"  rank {rank} (local rank {failure.local_rank}): {how}")
        message = failure.message
        if isinstance(message, dict):
            message = message.get("message", "")
        if message and "To enable traceback" not in str(message):
            lines.extend("    " + line for line in str(message).rstrip().splitlines())
    return "\n".join(lines)
