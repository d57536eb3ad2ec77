"""diffusers' offloading on acc's drop-in: a tiny DDPM pipeline built locally, with `enable_model_cpu_offload()` and
`enable_sequential_cpu_offload()` (hooks executing on the CPU, the device this machine has), gives the plain
pipeline's images, and the same images as on Hugging Face Accelerate 1.15 (tests/dropin/scripts/diffusers_offload.py
in both venvs)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.dropin.conftest import kept_reference

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

SCRIPT = Path(__file__).parent / "scripts" / "diffusers_offload.py"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1", "CUDA_VISIBLE_DEVICES": "", "ACC_DROPIN_QUIET": "1",
       "DIFFUSERS_VERBOSITY": "error"}


def offload(python: Path, out: Path) -> dict:
    proc = subprocess.run([str(python), str(SCRIPT), "--out", str(out)], capture_output=True, text=True, env=ENV,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(out.read_text())


def test_pipeline_offloading_gives_the_plain_pipelines_images_as_on_accelerate(dropin_python, accelerate_python,
                                                                              tmp_path):
    ours = offload(dropin_python, tmp_path / "acc.json")
    theirs = kept_reference(accelerate_python, SCRIPT, (), lambda: offload(accelerate_python, tmp_path / "ref.json"))
    for mode in ("enable_model_cpu_offload", "enable_sequential_cpu_offload"):
        assert "error" not in ours[mode], ours[mode]
        assert ours[mode]["max_difference"] == 0.0
        if "error" in theirs[mode]:
            # Accelerate 1.15 here (torch 2.13, diffusers 0.42): its set_module_tensor_to_device, moving a weight
            # back to meta after the forward, rebuilds the parameter's class with requires_grad=, which that
            # class's constructor rejects (TypeError); acc runs it
            print(f"diffusers {mode}: acc gives the plain pipeline's images exactly; Accelerate fails: "
                  f"{theirs[mode]['error']}")
            continue
        across = max(abs(a - b) for a, b in zip(ours[mode]["images"], theirs[mode]["images"], strict=True))
        print(f"diffusers {mode}: max |d image| against the plain pipeline {ours[mode]['max_difference']:.1e}, "
              f"against Accelerate {across:.1e}")
        assert across == 0.0
    assert "error" not in theirs["enable_model_cpu_offload"], theirs
