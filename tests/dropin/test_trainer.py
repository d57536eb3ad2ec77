"""transformers' Trainer on acc's `accelerate` drop-in against the same run on Hugging Face Accelerate 1.15 (its own
venv): a tiny causal LM built locally (tests/dropin/scripts/trainer_run.py: gradient accumulation 2, evaluation and a
checkpoint every 3 steps), uninterrupted and resumed from its step-3 checkpoint, on 1 process and on 2 (acc: `acc
launch --backend ddp`; Accelerate: torchrun). Every logged loss and every final weight agree within 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).parent / "scripts" / "trainer_run.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "ACC_DROPIN_QUIET": "1",
       "TRANSFORMERS_VERBOSITY": "error"}


def train(python: Path, impl: str, nproc: int, workdir: Path, resume: bool) -> dict:
    """Run the script (6 optimizer steps; with `resume`, 3 steps and then a run resumed from checkpoint-3)."""
    out_dir = workdir / f"{impl}-{nproc}-{'resume' if resume else 'straight'}"
    if nproc == 1:
        start = [str(python)]
    elif impl == "acc":
        start = [str(python), "-m", "acc", "launch", "--backend", "ddp", "--nproc", str(nproc)]
    else:
        start = [str(python), "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
    legs = [("3", False), ("6", True)] if resume else [("6", False)]
    for steps, again in legs:
        args = [str(SCRIPT), "--out", str(out_dir / "result.json"), "--output-dir", str(out_dir / "run"),
                "--max-steps", steps, *(["--resume"] if again else [])]
        proc = subprocess.run([*start, *args], capture_output=True, text=True, env=ENV, cwd=workdir, timeout=600)
        assert proc.returncode == 0, f"{impl} on {nproc} process(es), {steps} steps:\n{proc.stderr[-4000:]}"
    return json.loads((out_dir / "result.json").read_text())


def max_differences(a: dict, b: dict) -> tuple[float, float, float]:
    assert a["losses"].keys() == b["losses"].keys() and a["weights"].keys() == b["weights"].keys()
    loss = max(abs(a["losses"][k] - b["losses"][k]) for k in b["losses"])
    evals = max(abs(a["eval_losses"][k] - b["eval_losses"][k]) for k in b["eval_losses"])
    weight = max(abs(x - y) for k in b["weights"] for x, y in zip(a["weights"][k], b["weights"][k], strict=True))
    return loss, evals, weight


@pytest.mark.parametrize("nproc", [1, 2])
@pytest.mark.parametrize("resume", [False, True], ids=["straight", "resumed"])
def test_trainer_trains_on_acc_as_on_accelerate(dropin_python, accelerate_python, tmp_path, nproc, resume):
    ours = train(dropin_python, "acc", nproc, tmp_path, resume)
    theirs = train(accelerate_python, "accelerate", nproc, tmp_path, resume)
    assert ours["accelerate"].startswith("1.15.0+acc.") and theirs["accelerate"] == "1.15.0"
    assert ours["world_size"] == theirs["world_size"] == nproc
    assert sorted(map(int, ours["losses"])) == list(range(1, 7))  # every step logged, also across the resume
    assert ours["steps_here"] == theirs["steps_here"] == ([4, 5, 6] if resume else list(range(1, 7)))
    loss, evals, weight = max_differences(ours, theirs)
    print(f"Trainer, {nproc} process(es), {'resumed' if resume else 'straight'}: max |d loss| {loss:.2e}, "
          f"max |d eval loss| {evals:.2e}, max |d weight| {weight:.2e}")
    assert loss <= 1e-5 and evals <= 1e-5 and weight <= 1e-5
