"""The drop-in lane's venvs (scripts/dropin-venv.sh): transformers on acc's `accelerate` drop-in, and the same pins
on Hugging Face Accelerate 1.15. Built once per machine and cached under ~/.cache/acc; a failed build fails these
tests, never skips them."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _venv(which: str) -> Path:
    proc = subprocess.run([str(ROOT / "scripts" / "dropin-venv.sh"), which], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/dropin-venv.sh {which} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def dropin_python() -> Path:
    return _venv("acc")


@pytest.fixture(scope="session")
def accelerate_python() -> Path:
    return _venv("accelerate")
