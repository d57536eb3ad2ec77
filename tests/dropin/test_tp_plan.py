"""Tensor parallelism of a transformers model on acc's device mesh (tests/dropin/scripts/tp_plan_run.py: a tiny
Llama saved locally, 3 SGD steps), each run against the same script on one process:

- `from_pretrained(tp_size=2, tp_plan="auto", device_mesh=accelerator.torch_device_mesh)` on 2 processes
  (transformers parallelizes the model; acc's fsdp backend leaves it as it is);
- a model loaded plainly and prepared on a TP 2 x FSDP 2 mesh (4 processes): acc applies transformers' own plan
  (`model.tp_plan`: colwise/rowwise, `colwise_gather_output` lm_head, `embedding_rowwise` embeddings), then shards.

The first forward's logits, every step's loss (reduced over the data-parallel ranks) and the final weights agree
within 1e-5."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).parent / "scripts" / "tp_plan_run.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "ACC_DROPIN_QUIET": "1",
       "TRANSFORMERS_VERBOSITY": "error"}
TOLERANCE = 1e-5


def run(python: Path, start: list[str], args: list[str], cwd: Path) -> None:
    proc = subprocess.run([str(python), *start, str(SCRIPT), *args], capture_output=True, text=True, env=ENV,
                          cwd=cwd, timeout=600)
    assert proc.returncode == 0, f"{' '.join(start)} {' '.join(args)}:\n{proc.stderr[-4000:]}"


@pytest.fixture(scope="module")
def checkpoint(dropin_python, tmp_path_factory) -> dict:
    work = tmp_path_factory.mktemp("tp-plan")
    run(dropin_python, [], ["--build", str(work / "model")], work)
    run(dropin_python, [], ["--model", str(work / "model"), "--out", str(work / "one.pt")], work)
    return {"work": work, "model": work / "model", "one": torch.load(work / "one.pt")}


@pytest.mark.parametrize("label,nproc,sizes,extra", [
    ("transformers tp_plan auto, TP 2", 2, ["--parallelism-config-tp-size", "2"], ["--tp-plan"]),
    ("acc applies transformers' plan, TP 2 x FSDP 2", 4,
     ["--parallelism-config-tp-size", "2", "--parallelism-config-dp-shard-size", "2"], []),
], ids=["from_pretrained-tp2", "acc-plan-tp2xfsdp2"])
def test_tensor_parallel_llama_matches_one_process(dropin_python, checkpoint, label, nproc, sizes, extra):
    work, out = checkpoint["work"], checkpoint["work"] / f"{nproc}.pt"
    run(dropin_python, ["-m", "acc", "launch", "--backend", "fsdp", "--nproc", str(nproc), *sizes],
        ["--model", str(checkpoint["model"]), "--out", str(out), *extra], work)
    got, want = torch.load(out), checkpoint["one"]
    assert got["world"] == nproc and want["world"] == 1
    assert got["dtensor"] > 0 and want["dtensor"] == 0  # the run really was parallelized
    logits = float((got["logits"] - want["logits"]).abs().max())
    losses = max(abs(a - b) for a, b in zip(got["losses"], want["losses"], strict=True))
    assert sorted(got["weights"]) == sorted(want["weights"])
    weights = max(float((got["weights"][k] - want["weights"][k]).abs().max()) for k in want["weights"])
    print(f"{label}: max |d logits| {logits:.2e}, max |d loss| {losses:.2e}, max |d weight| {weights:.2e}")
    assert logits <= TOLERANCE and losses <= TOLERANCE and weights <= TOLERANCE
