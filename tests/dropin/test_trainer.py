"""transformers' Trainer on acc's `accelerate` drop-in against the same run on Hugging Face Accelerate 1.15 (its own
venv): a tiny causal LM built locally (tests/dropin/scripts/trainer_run.py: gradient accumulation 2, evaluation and a
checkpoint every 3 steps), uninterrupted and resumed from its step-3 checkpoint. On acc: 1 process, and 2 processes
on ddp, on fsdp (`TrainingArguments(fsdp=...)`) and on deepspeed (`TrainingArguments(deepspeed=...)`, ZeRO 2 and 3);
a peft LoRA adapter on 1 and 2 processes.
The reference is Accelerate on 1 process, or on 2 under torchrun: its DDP (on a CPU, Accelerate runs
`TrainingArguments(fsdp=...)` as DDP too), and its DeepSpeed (on DeepSpeed's CPU accelerator) for the deepspeed
runs. Every logged loss and every final weight agree within 1e-5."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.dropin.conftest import kept_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

SCRIPT = Path(__file__).parent / "scripts" / "trainer_run.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "ACC_DROPIN_QUIET": "1",
       "TRANSFORMERS_VERBOSITY": "error", "DS_ACCELERATOR": "cpu"}
TOLERANCE = 1e-5


def train(python: Path, start: list[str], workdir: Path, resume: bool, extra: tuple[str, ...] = ()) -> dict:
    """Run the script under `start` (6 optimizer steps; with `resume`, 3 steps, then a run resumed from
    checkpoint-3) and return what its main process wrote."""
    out = workdir / "result.json"
    for steps, again in ([("3", False), ("6", True)] if resume else [("6", False)]):
        args = [str(SCRIPT), "--out", str(out), "--output-dir", str(workdir / "run"), "--max-steps", steps,
                *(["--resume"] if again else []), *extra]
        proc = subprocess.run([str(python), *start, *args], capture_output=True, text=True, env=ENV, cwd=workdir,
                              timeout=600)
        assert proc.returncode == 0, f"{python} {' '.join(start)} ({steps} steps):\n{proc.stderr[-4000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="session")
def reference(accelerate_python, tmp_path_factory):
    """Accelerate's results by (processes, resumed, script arguments), each run once per session."""
    runs: dict[tuple[int, bool, tuple[str, ...]], dict] = {}

    def get(nproc: int, resume: bool, extra: tuple[str, ...] = ()) -> dict:
        key = (nproc, resume, extra)
        if key not in runs:
            start = [] if nproc == 1 else ["-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}"]
            workdir = tmp_path_factory.mktemp(f"accelerate-{nproc}-{resume}")
            runs[key] = kept_reference(accelerate_python, SCRIPT, (nproc, resume, *extra),
                                       lambda: train(accelerate_python, start, workdir, resume, extra))
            assert runs[key]["accelerate"] == "1.15.0"
        return runs[key]

    return get


def compare(ours: dict, theirs: dict, label: str, resume: bool) -> None:
    assert ours["accelerate"].startswith("1.15.0+acc.") and ours["world_size"] == theirs["world_size"]
    assert sorted(map(int, ours["losses"])) == list(range(1, 7))  # every step logged, also across the resume
    assert ours["steps_here"] == theirs["steps_here"] == ([4, 5, 6] if resume else list(range(1, 7)))
    assert ours["eval_losses"].keys() == theirs["eval_losses"].keys() and ours["weights"].keys() == theirs["weights"].keys()
    loss = max(abs(ours["losses"][k] - theirs["losses"][k]) for k in theirs["losses"])
    evals = max(abs(ours["eval_losses"][k] - theirs["eval_losses"][k]) for k in theirs["eval_losses"])
    weight = max(abs(x - y) for k in theirs["weights"]
                 for x, y in zip(ours["weights"][k], theirs["weights"][k], strict=True))
    print(f"Trainer, {label}, {'resumed' if resume else 'straight'}: max |d loss| {loss:.2e}, "
          f"max |d eval loss| {evals:.2e}, max |d weight| {weight:.2e}")
    assert loss <= TOLERANCE and evals <= TOLERANCE and weight <= TOLERANCE


CASES = [  # (label, processes, acc launch arguments, script arguments, Accelerate's script arguments)
    ("1 process", 1, None, (), ()),
    ("ddp, 2 processes", 2, ["--backend", "ddp"], (), ()),
    ("fsdp, 2 processes", 2, ["--backend", "fsdp"], ("--fsdp",), ()),
    ("deepspeed ZeRO-2, 2 processes", 2, ["--backend", "deepspeed"], ("--deepspeed", "2"), ("--deepspeed", "2")),
    ("peft LoRA, 1 process", 1, None, ("--lora",), ("--lora",)),
    ("peft LoRA on ddp, 2 processes", 2, ["--backend", "ddp"], ("--lora",), ("--lora",)),
]


@pytest.mark.parametrize("resume", [False, True], ids=["straight", "resumed"])
@pytest.mark.parametrize("label,nproc,launch,extra,theirs", CASES, ids=[c[0].replace(", ", "-").replace(" ", "_") for c in CASES])
def test_trainer_trains_on_acc_as_on_accelerate(dropin_python, reference, tmp_path, label, nproc, launch, extra,
                                                theirs, resume):
    start = [] if launch is None else ["-m", "acc", "launch", *launch, "--nproc", str(nproc)]
    compare(train(dropin_python, start, tmp_path, resume, extra), reference(nproc, resume, theirs), label, resume)


def test_trainer_on_zero_3_trains_as_on_accelerate(dropin_python, reference, tmp_path):
    start = ["-m", "acc", "launch", "--backend", "deepspeed", "--nproc", "2"]
    extra = ("--deepspeed", "3")
    compare(train(dropin_python, start, tmp_path, False, extra), reference(2, False, extra),
            "deepspeed ZeRO-3, 2 processes", False)
