"""The examples train for real through `acc launch`: the loss falls."""

from __future__ import annotations

import re

import pytest

from tests.conftest import ACC, ROOT, run

pytestmark = pytest.mark.slow


def losses(output: str) -> list[float]:
    return [float(x) for x in re.findall(r"train loss ([0-9.]+)", output)]


@pytest.mark.parametrize("launch", [[], ["--backend", "ddp", "--nproc", "2"]], ids=["cpu", "ddp2"])
def test_quickstart_trains(tmp_path, launch):
    proc = run([ACC, "launch", *launch, str(ROOT / "examples" / "quickstart.py"), "--epochs", "5"], tmp_path,
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    found = losses(proc.stdout)
    assert len(found) == 5, proc.stdout  # printed once (main process), one line per epoch
    assert found[-1] < 0.8 * found[0], found
    assert "500 samples" in proc.stdout  # evaluation saw every test sample exactly once


LAUNCHES = {"cpu": [], "ddp2": ["--backend", "ddp", "--nproc", "2"]}


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_digits_example(tmp_path, launch):
    proc = run([ACC, "launch", *LAUNCHES[launch], "--output-dir", "", str(ROOT / "examples" / "digits.py"),
                "--epochs", "2", "--max-steps", "3", "--project-dir", str(tmp_path / "p")], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1: test accuracy" in proc.stdout and "on 360 images" in proc.stdout
    assert "final test accuracy" in proc.stdout
    resumed = run([ACC, "launch", *LAUNCHES[launch], "--output-dir", "", str(ROOT / "examples" / "digits.py"),
                   "--epochs", "3", "--max-steps", "3", "--project-dir", str(tmp_path / "p"), "--resume"], tmp_path,
                  timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed after epoch 1" in resumed.stdout and "epoch 2: test accuracy" in resumed.stdout
    assert "epoch 0:" not in resumed.stdout


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_char_lm_example_with_bf16_accumulation_and_resume(tmp_path, launch):
    common = [ACC, "launch", *LAUNCHES[launch], "--mixed-precision", "bf16", "--output-dir", "",
              str(ROOT / "examples" / "char_lm.py"), "--chars", "40000", "--context", "32", "--batch-size", "8",
              "--grad-accum", "2", "--eval-every", "2", "--project-dir", str(tmp_path / "p")]
    proc = run([*common, "--steps", "4"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "step 4: validation loss" in proc.stdout and "final validation loss" in proc.stdout and "sample:" in proc.stdout
    resumed = run([*common, "--steps", "6", "--resume"], tmp_path, timeout=300)
    assert resumed.returncode == 0, resumed.stderr
    assert "resumed at optimizer step 4" in resumed.stdout and "step 6: validation loss" in resumed.stdout


@pytest.mark.parametrize("launch", list(LAUNCHES))
def test_migration_example(tmp_path, launch):
    proc = run([ACC, "launch", *LAUNCHES[launch], "--output-dir", "", str(ROOT / "examples" /
                "migrate_from_accelerate.py"), "--epochs", "2", "--output-dir", str(tmp_path / "o")], tmp_path,
               timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "epoch 1: accuracy" in proc.stdout and "(500 samples)" in proc.stdout
    assert (tmp_path / "o" / "model.pt").is_file() and (tmp_path / "o" / "state" / "manifest.json").is_file()
    assert "from acc import Accelerator  # was: from accelerate import Accelerator" in (
        ROOT / "examples" / "migrate_from_accelerate.py").read_text()
