"""The `pjrt` engine: workers started the PJRT way, by torch_xla's `xmp.spawn` (what `torch_xla.launch` calls).

The launcher turns into (or, for `acc check`, starts) `python -m acc.launcher.pjrt NPROC TARGET...`, a small
driver that calls `xmp.spawn(run_target, nprocs=...)` with the worker environment. PJRT then starts one
process per local device (TPU chip), or runs the target in this process when the plan asks for one:
`nprocs=1` is PJRT's single-process mode (it still configures a one-chip topology on a TPU host); any
other count means "every local device", the only other count xmp.spawn accepts, so the backend's plan
must ask for 1 or for exactly the local device count. Each worker runs the user's script as `__main__`
with its own argv, as `python script.py ARGS` would. Torch-free until the driver runs.
"""

from __future__ import annotations

import os
import sys
from types import TracebackType
from typing import Mapping, Sequence

from acc.contract.launch_plan import LaunchPlan, Target

MODULE = "acc.launcher.pjrt"


def driver_argv(plan: LaunchPlan, target: Target, python: str) -> list[str]:
    """The command line of the PJRT driver process for `plan` and `target`."""
    head = [python, "-m", MODULE, str(plan.nproc_per_machine)]
    return head + (["-m", target.program] if target.is_module else [target.program]) + list(target.args)


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str], replace: bool = True) -> int:
    """Become the PJRT driver (never returns), or with `replace=False` run it as a child and return its
    exit code (128+N when a signal ended it)."""
    argv = driver_argv(plan, target, sys.executable)
    sys.stdout.flush()
    sys.stderr.flush()
    if not replace:
        import subprocess

        code = subprocess.run(argv, env=dict(env)).returncode
        return code if code >= 0 else 128 - code
    os.execve(sys.executable, argv, dict(env))
    return 0  # pragma: no cover  (execve does not return)


def parse_driver_args(args: Sequence[str]) -> tuple[int, Target]:
    """(processes, target) from the driver's arguments `NPROC [-m] PROGRAM ARGS...`."""
    if len(args) < 2 or not args[0].isdigit():
        raise SystemExit(f"usage: python -m {MODULE} NPROC [-m] PROGRAM [ARGS...]")
    nproc, rest = int(args[0]), list(args[1:])
    if rest[0] == "-m":
        if len(rest) < 2:
            raise SystemExit(f"usage: python -m {MODULE} NPROC -m MODULE [ARGS...]")
        return nproc, Target(rest[1], tuple(rest[2:]), is_module=True)
    return nproc, Target(rest[0], tuple(rest[1:]))


def run_target(index: int, target: Target) -> None:
    """One PJRT worker (`index` is its global ordinal): run the target as `__main__` with its own argv."""
    import runpy

    if target.is_module:
        sys.argv = [target.program, *target.args]  # run_module sets argv[0] to the module's file
        runpy.run_module(target.program, run_name="__main__", alter_sys=True)
        return
    sys.argv = [target.program, *target.args]
    script_dir = os.path.dirname(os.path.abspath(target.program))
    if sys.path and sys.path[0] in ("", os.getcwd()):  # `python -m` put the cwd first; a script sees its dir
        sys.path[0] = script_dir
    else:
        sys.path.insert(0, script_dir)
    try:
        runpy.run_path(target.program, run_name="__main__")
    except SystemExit as exc:  # sys.exit(0) ends a worker well; any other code is its failure
        if exc.code not in (None, 0):
            raise


def main(args: Sequence[str] | None = None) -> None:
    """The driver: `xmp.spawn(run_target, nprocs=1 or None)`."""
    nproc, target = parse_driver_args(sys.argv[1:] if args is None else args)
    import torch_xla.distributed.xla_multiprocessing as xmp

    try:  # xmp.spawn accepts 1 (this process) or None (one process per local device)
        xmp.spawn(run_target, args=(target,), nprocs=1 if nproc == 1 else None)
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as exc:  # noqa: BLE001 - reported as `python script.py` would, then exit 1
        tb = _user_frames(exc.__traceback__)
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
        sys.exit(1)


def _user_frames(tb: TracebackType | None) -> TracebackType | None:
    """The traceback from the user's code on: what follows the runpy frames that started it (the driver's
    and PJRT's frames before them are left out)."""
    entry, in_runpy = tb, False
    while entry is not None:
        name = entry.tb_frame.f_code.co_filename
        if name == "<frozen runpy>" or name.endswith(f"{os.sep}runpy.py"):
            in_runpy = True
        elif in_runpy:
            return entry
        entry = entry.tb_next
    return tb


if __name__ == "__main__":
    main()
