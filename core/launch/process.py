"""The `process` engine: the launcher becomes the worker (exec), so signals, exit codes and output
belong to the user's script with nothing in between. Torch-free."""

from __future__ import annotations

import os
import sys
from typing import Mapping

from .plan import LaunchPlan, Target


def execute(plan: LaunchPlan, target: Target, env: Mapping[str, str]) -> int:
    """Replace this process with `python SCRIPT ARGS` (never returns on success)."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, target.argv(sys.executable), dict(env))
    return 0  # pragma: no cover  (execve does not return)
