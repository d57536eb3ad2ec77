"""The trackers venv (torch, tensorboard, mlflow, wandb, matplotlib, acc-core and the tracker plugins), built once
per machine by scripts/trackers-venv.sh and cached under ~/.cache/acc. A failed build fails these tests; never a
skip. Every test runs its scripts with that venv's python."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, clean_env

VENV_SCRIPT = ROOT / "scripts" / "trackers-venv.sh"
READERS = Path(__file__).with_name("readers.py")
WORKER = ROOT / "tests" / "workers" / "tracking_train.py"


@pytest.fixture(scope="session")
def trackers_python() -> Path:
    start = time.monotonic()
    proc = subprocess.run([str(VENV_SCRIPT)], capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{VENV_SCRIPT} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    print(f"\ntrackers venv ready in {time.monotonic() - start:.1f} s")
    return Path(proc.stdout.strip().splitlines()[-1])


def tracker_env(tmp_path: Path, **extra: str) -> dict:
    """A clean environment for one run: W&B offline with its own config/cache dirs, no MLflow URI."""
    env = clean_env(tmp_path, OMP_NUM_THREADS="1", WANDB_MODE="offline",
                    WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"), WANDB_CACHE_DIR=str(tmp_path / "wandb-cache"),
                    WANDB_DATA_DIR=str(tmp_path / "wandb-data"), **extra)
    for key in [k for k in env if k.startswith("MLFLOW_")]:
        del env[key]
    return env


def run_py(python: Path, args: list[str], tmp_path: Path, timeout: float = 300,
           **extra: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(python), *args], cwd=tmp_path, env=tracker_env(tmp_path, **extra),
                          capture_output=True, text=True, timeout=timeout)


def train(python: Path, tmp_path: Path, *args: str, nproc: int = 1, name: str = "run",
          **extra: str) -> tuple[subprocess.CompletedProcess, dict[int, dict]]:
    """tests/workers/tracking_train.py in the trackers venv, on the cpu backend or on `nproc` ddp processes."""
    out = tmp_path / name / "out"
    project = tmp_path / name / "project"
    launch = [] if nproc == 1 else ["-m", "acc", "launch", "--backend", "ddp", "--nproc", str(nproc),
                                    "--output-dir", ""]
    proc = run_py(python, [*launch, str(WORKER), "--out", str(out), "--project-dir", str(project), *args],
                  tmp_path, **extra)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    ranks = {int(p.stem[4:]): json.loads(p.read_text()) for p in sorted(out.glob("rank*.json"))}
    assert sorted(ranks) == list(range(nproc)), ranks
    return proc, ranks


def read_back(python: Path, kind: str, where: str | Path, tmp_path: Path) -> dict:
    proc = run_py(python, [str(READERS), kind, str(where)], tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])
