"""Launch to first step of 2 processes: `acc.launch(fn)` from a Python program vs `acc launch script.py`, the same
training function (Accelerator, a prepared model, one optimizer step), alternating. Each figure is the wall-clock
time from starting the program (a fresh interpreter either way) to rank 0's first completed step."""

from __future__ import annotations

import json
import subprocess
import time

from common import ACC, BIN, WORKLOADS, Result, alternate, env_for_bench


def _first_step(cmd: list[str], env: dict) -> float:
    started = time.time()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    for line in proc.stdout.splitlines():
        if line.startswith("BENCH "):
            return json.loads(line[6:])["first_step"] - started
    raise RuntimeError(f"{' '.join(cmd)} printed no BENCH line:\n{proc.stdout}\n{proc.stderr}")


def run(repeats: int) -> list[Result]:
    env = env_for_bench(OMP_NUM_THREADS="1")
    script = str(WORKLOADS / "first_step.py")
    python = [str(BIN / "python"), script, "--python"]
    cli = [ACC, "launch", "--output-dir", "", "--backend", "ddp", "--nproc", "2", script]
    value, base = alternate(lambda: _first_step(python, env), lambda: _first_step(cli, env), repeats)
    return [Result("launch to first step, 2 processes", "acc.launch(fn) from Python", "acc launch script.py",
                   value, base, "s", repeats)]
