"""`acc check --mixed-precision MODE` measures the mode against fp32; scripts/gpu-check.sh says when there is no GPU."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from tests.conftest import ACC, ROOT, clean_env, run


def test_acc_check_mixed_precision_reports_the_step_time_ratio_and_the_loss_difference(tmp_path):
    proc = run([ACC, "check", "--backend", "cpu", "--mixed-precision", "bf16"], tmp_path, timeout=240)
    out = proc.stdout
    assert proc.returncode == 0, out + proc.stderr[-3000:]
    assert out.count("PASS") == 8 and "FAIL" not in out  # the checks acc check always ran are all there
    header = next(line for line in out.splitlines() if line.startswith("mixed precision bf16 against fp32 on cpu: "))
    assert re.search(r": (native|EMULATED|unknown) \(", header), header
    ratio = re.search(r"^  step time ratio bf16/fp32  (\d+\.\d+)  \(bf16 [\d.e+]+ ms/step, fp32 [\d.e+]+ ms/step\)$",
                      out, re.M)
    assert ratio and float(ratio.group(1)) > 0, out
    assert re.search(r"^  loss difference bf16-fp32  max relative \d\.\d\de[-+]\d+, max absolute \d\.\d\de[-+]\d+ "
                     r"over 4 steps", out, re.M), out
    assert "median of 5 alternating repeats" in out
    print(header, ratio.group(0), sep="\n")  # shown with -s: the real CPU's figure


def test_acc_check_mixed_precision_json_and_fp16_trained_in_float32_on_the_cpu(tmp_path):
    proc = run([ACC, "check", "--backend", "cpu", "--mixed-precision", "fp16", "--json"], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    data = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert data["precision"]["mode"] == "fp16" and "skipped" in data["precision"]
    assert "--fp16-on-cpu" in data["precision"]["skipped"]


@pytest.mark.cuda
def test_acc_check_mixed_precision_on_cuda(tmp_path):
    proc = run([ACC, "check", "--backend", "cpu", "--mixed-precision", "bf16"], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-3000:]
    assert "mixed precision bf16 against fp32 on cuda" in proc.stdout and "step time ratio bf16/fp32" in proc.stdout


def test_gpu_check_script_says_in_one_line_that_there_is_no_cuda_device(tmp_path):
    script = ROOT / "scripts" / "gpu-check.sh"
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is here: scripts/gpu-check.sh runs the whole check")
    env = clean_env(tmp_path, ACC_GPU_VENV=str(tmp_path / "gpu-venv"), ACC_GPU_CHECK_DIR=str(tmp_path / "out"))
    env.pop("ACC_GPU_PYTHON", None)
    proc = subprocess.run(["bash", str(script)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in (proc.stdout + proc.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("gpu-check: no CUDA device: "), lines
    assert "torch.cuda.is_available() = False" in lines[0] or "no torch" in lines[0]
