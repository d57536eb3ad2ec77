"""Big-model loading through transformers on acc's drop-in: `from_pretrained(device_map="auto", max_memory=...,
offload_folder=...)` with a CPU budget that sends layers to disk gives the logits of the model loaded whole, with
the device map Hugging Face Accelerate 1.15 plans for the same budget (tests/dropin/scripts/from_pretrained_offload.py
in both venvs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.dropin.conftest import kept_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "from_pretrained_offload.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "ACC_DROPIN_QUIET": "1",
       "TRANSFORMERS_VERBOSITY": "error"}


def load(python: Path, workdir: Path, budget: str) -> dict:
    workdir.mkdir()
    out = workdir / "result.json"
    proc = subprocess.run([str(python), str(SCRIPT), "--out", str(out), "--workdir", str(workdir),
                           "--cpu-budget", budget], capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


@pytest.mark.parametrize("budget", ["300KB", "500KB"])
def test_from_pretrained_with_disk_offload_gives_the_whole_models_logits(dropin_python, accelerate_python, tmp_path,
                                                                         budget):
    ours = load(dropin_python, tmp_path / "acc", budget)
    theirs = kept_reference(accelerate_python, SCRIPT, (budget,),
                            lambda: load(accelerate_python, tmp_path / "accelerate", budget))
    assert "disk" in ours["device_map"].values() and "cpu" in ours["device_map"].values()
    assert ours["device_map"] == theirs["device_map"]
    print(f"from_pretrained, cpu budget {budget}: max |d logits| acc {ours['max_difference']:.1e}, "
          f"Accelerate {theirs['max_difference']:.1e}")
    assert ours["max_difference"] == 0.0 and theirs["max_difference"] == 0.0
