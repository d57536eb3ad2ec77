"""A script written as Accelerate's examples/torch_native_parallelism/nd_parallel.py is (tests/dropin/scripts/
nd_parallel_style.py: its calls, acc's code, a tiny Llama built locally) runs under a plain `acc launch --nproc 2`,
with no --backend, as the example runs under `accelerate launch`: its FullyShardedDataParallelPlugin, or its
ParallelismConfig's tp dimension, selects the fsdp backend (the launch detected ddp), its `log_with=["wandb"]` is
left out with a note where wandb is not installed, and it trains as one process does on the same global batches:
every step's loss and the final weights within 1e-5 (fp32, 3 SGD steps)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPTS = Path(__file__).parent / "scripts"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "ACC_DROPIN_QUIET": "1",
       "TRANSFORMERS_VERBOSITY": "error"}
for _name in ("ACC_BACKEND", "ACC_LOG_WITH", "ACC_MISSING_TRACKER", "ACC_SEMANTICS"):
    ENV.pop(_name, None)
TOLERANCE = 1e-5


def run(python: Path, args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    proc = subprocess.run([str(python), *args], capture_output=True, text=True, env=ENV, cwd=cwd, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stderr[-4000:]}"
    return proc


@pytest.fixture(scope="module")
def model_dir(dropin_python, tmp_path_factory) -> Path:
    work = tmp_path_factory.mktemp("nd-parallel-style")
    run(dropin_python, [str(SCRIPTS / "tp_plan_run.py"), "--build", str(work / "model")], work)
    return work / "model"


def one_process(python: Path, model: Path, work: Path, batch: int) -> dict:
    out = work / f"one-{batch}.pt"
    run(python, ["-m", "acc", "launch", "--backend", "ddp", "--nproc", "1", str(SCRIPTS / "nd_parallel_style.py"),
                 "--model", str(model), "--out", str(out), "--batch", str(batch)], work)
    return torch.load(out)


@pytest.mark.parametrize("label,sizes,dp", [
    ("dp_shard 2 (the script's FullyShardedDataParallelPlugin)", ["--dp-shard-size", "2"], 2),
    ("tp 2 (from_pretrained(tp_plan='auto'); no plugin)", ["--tp-size", "2"], 1),
], ids=["dp_shard2", "tp2"])
def test_the_example_style_script_trains_under_a_plain_launch_as_one_process(dropin_python, model_dir, tmp_path,
                                                                           label, sizes, dp):
    out, saved = tmp_path / "two.pt", tmp_path / "ckpt"
    proc = run(dropin_python, ["-m", "acc", "launch", "--nproc", "2", str(SCRIPTS / "nd_parallel_style.py"),
                               "--model", str(model_dir), "--out", str(out), "--save-dir", str(saved), *sizes], tmp_path)
    assert "with the ddp backend (detected" in proc.stderr
    assert "selects the fsdp backend, as Accelerate trains it" in proc.stderr
    assert "tracker 'wandb' is not installed" in proc.stderr and "it is left out" in proc.stderr
    got, want = torch.load(out), one_process(dropin_python, model_dir, tmp_path, dp)
    assert got["world"] == 2 and got["distributed_type"].endswith("FSDP") and got["dtensor"] > 0
    assert want["world"] == 1 and want["dtensor"] == 0
    assert (saved / "manifest.json").exists() == ("--dp-shard-size" in sizes)  # save_state while sharded
    assert sorted(got["weights"]) == sorted(want["weights"])
    losses = max(abs(a - b) for a, b in zip(got["losses"], want["losses"], strict=True))
    weights = max(float((got["weights"][k] - want["weights"][k]).abs().max()) for k in want["weights"])
    print(f"nd_parallel-style script, {label}, plain acc launch --nproc 2: max |d loss| {losses:.2e}, "
          f"max |d weight| {weights:.2e}")
    assert len(got["losses"]) == 3 and losses <= TOLERANCE and weights <= TOLERANCE
