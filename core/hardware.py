"""Hardware facts the launcher can read without importing torch (it must stay torch-free)."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Mapping

NVIDIA_PROC = Path("/proc/driver/nvidia/gpus")


def visible_cuda_devices(environ: Mapping[str, str] | None = None) -> int:
    """How many NVIDIA GPUs this process may use: CUDA_VISIBLE_DEVICES if set, else the driver's count."""
    environ = os.environ if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        entries = [e for e in visible.split(",") if e.strip()]
        valid = []
        for e in entries:  # CUDA stops at the first invalid entry (e.g. -1)
            if e.strip().startswith("-"):
                break
            valid.append(e)
        return len(valid)
    try:
        return sum(1 for _ in NVIDIA_PROC.iterdir())
    except OSError:
        return 0


def is_apple_silicon() -> bool:
    return platform.system() == "Darwin" and platform.machine() == "arm64"
