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


ND_LAYOUTS = {  # processes, the example's size flags, the mesh it prints, the backend the config selects
    "ddp": (2, ["--dp-replicate-size", "2"], "{'dp_replicate': 2}", "ddp"),
    "fsdp": (2, ["--dp-shard-size", "2"], "{'dp_shard': 2}", "fsdp"),
    "tp": (2, ["--tp-size", "2"], "{'tp': 2}", "fsdp"),
    "tp-x-fsdp": (4, ["--dp-shard-size", "2", "--tp-size", "2"], "{'dp_shard': 2, 'tp': 2}", "fsdp"),
}


@pytest.fixture(scope="module")
def nd_runs(tmp_path_factory):
    """examples/nd_parallel.py under a plain `acc launch --nproc N` (no --backend), one run per layout."""
    runs = {}
    for name, (nproc, sizes, _, _) in ND_LAYOUTS.items():
        tmp = tmp_path_factory.mktemp(name)
        runs[name] = run([ACC, "launch", "--nproc", str(nproc), "--output-dir", "",
                          str(ROOT / "examples" / "nd_parallel.py"), *sizes, "--steps", "10", "--save",
                          str(tmp / "ckpt")], tmp, timeout=300)
        runs[name].checkpoint = tmp / "ckpt"
    return runs


@pytest.mark.parametrize("name", list(ND_LAYOUTS))
def test_the_nd_parallel_example_trains_on_each_layout_as_on_ddp(nd_runs, name):
    proc, (_, _, mesh, backend) = nd_runs[name], ND_LAYOUTS[name]
    assert proc.returncode == 0, proc.stderr
    assert f"mesh: {mesh}, backend {backend}" in proc.stdout
    found = losses(proc.stdout)
    assert len(found) == 2 and found[-1] < 0.8 * found[0], proc.stdout  # steps 1 and 10
    # the same global batches and the same model on every layout: the same losses, to the 4 decimals printed
    assert found == losses(nd_runs["ddp"].stdout)


def test_the_nd_parallel_example_resumes_a_tp_x_fsdp_checkpoint_on_fsdp_as_if_never_stopped(nd_runs, tmp_path):
    saved = nd_runs["tp-x-fsdp"].checkpoint
    example = str(ROOT / "examples" / "nd_parallel.py")
    resumed = run([ACC, "launch", "--nproc", "2", "--output-dir", "", example, "--dp-shard-size", "2", "--steps", "10",
                   "--load", str(saved)], tmp_path, timeout=300)
    straight = run([ACC, "launch", "--nproc", "4", "--output-dir", "", example, "--dp-shard-size", "2", "--tp-size",
                    "2", "--steps", "20"], tmp_path, timeout=300)
    assert resumed.returncode == 0 and straight.returncode == 0, resumed.stderr + straight.stderr
    assert losses(resumed.stdout)[-1] == losses(straight.stdout)[-1]  # step 20, to the 4 decimals printed
