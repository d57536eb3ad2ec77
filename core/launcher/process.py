"""The `process` engine: the launcher becomes the worker (exec), so signals, exit codes and output
belong to the user's script with nothing in between. Torch-free."""

from __future__ import annotations

import os
import sys
from typing import Mapping

from acc.contract.launch_plan import LaunchPlan, Target


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str], replace: bool = True) -> int:
    """Replace this process with `python SCRIPT ARGS` (never returns), or with `replace=False` run it as a
    child and return its exit code (for commands that report afterwards, like `acc check`)."""
    sys.stdout.flush()
    sys.stderr.flush()
    argv = target.argv(sys.executable)
    if not replace:
        import subprocess

        code = subprocess.run(argv, env=dict(env)).returncode
        return code if code >= 0 else 128 - code
    if target.no_python:  # a program found like a shell finds it (a path, or a name on PATH)
        os.execvpe(argv[0], argv, dict(env))
    os.execve(sys.executable, argv, dict(env))
    return 0  # pragma: no cover  (execve does not return)
