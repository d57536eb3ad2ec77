"""The xla backend end to end on the XLA CPU device (xla lane): real `acc launch --backend xla` runs of the
ordinary worker scripts the cpu and ddp tests use, compared with the cpu backend in the same venv."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results, run
from tests.plugins.xla.conftest import needs_xla

pytestmark = [pytest.mark.slow, needs_xla]

HERE = Path(__file__).resolve().parent


def acc_launch(tmp_path: Path, script: Path, args: list[str], backend: str = "xla", launch: list[str] = (),
               expect: int = 0) -> subprocess.CompletedProcess:
    proc = run([ACC, "launch", "--backend", backend, "--output-dir", "", *launch, str(script), *args], tmp_path,
               timeout=300)
    assert proc.returncode == expect, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


def test_the_ordinary_script_trains_20_steps_and_matches_the_cpu_backend(tmp_path):
    args = ["--samples", "20", "--batch", "4", "--epochs", "4"]  # 5 batches per epoch, the same each epoch
    acc_launch(tmp_path, WORKERS / "train_mlp.py", ["--out", str(tmp_path / "xla"), *args])
    acc_launch(tmp_path, WORKERS / "train_mlp.py", ["--out", str(tmp_path / "cpu"), *args], backend="cpu")
    xla, cpu = read_rank_results(tmp_path / "xla")[0], read_rank_results(tmp_path / "cpu")[0]
    assert xla["backend"] == "xla" and xla["device"] == "xla:0" and cpu["device"] == "cpu"
    assert len(xla["losses"]) == 20 and xla["seen"] == cpu["seen"]
    for step, (a, b) in enumerate(zip(xla["losses"], cpu["losses"])):
        assert abs(a - b) <= 1e-4 * abs(b), f"step {step}: xla {a} vs cpu {b}"
    assert torch.allclose(torch.tensor(xla["weights"]), torch.tensor(cpu["weights"]), rtol=1e-4, atol=1e-6)
    first, last = sum(xla["losses"][:5]) / 5, sum(xla["losses"][-5:]) / 5
    assert last < 0.8 * first, f"the loss on the same 5 batches did not fall: epoch 1 {first}, epoch 4 {last}"


@pytest.mark.parametrize("variant,warm_up", [
    (["--opt", "sgd"], 1),
    (["--opt", "adam", "--dropout", "0.2"], 2),  # Adam creates its state in step 1: step 2 is the steady graph
    (["--opt", "adam", "--mixed-precision", "bf16"], 2),
])
def test_steps_after_warm_up_replay_the_compiled_graph(tmp_path, variant, warm_up):
    acc_launch(tmp_path, HERE / "workers" / "compiles.py", ["--out", str(tmp_path), "--steps", "20", *variant])
    res = read_rank_results(tmp_path)[0]
    compiles = res["compiles"]  # compiles[k]: graphs compiled before step k was traced; the last: after step 20
    assert res["x_device"] == "xla:0" and len(compiles) == 21
    assert compiles[warm_up] > compiles[0], "the first step compiled nothing?"
    assert compiles[warm_up:] == [compiles[warm_up]] * (21 - warm_up), f"recompiled after warm-up: {compiles}"
    assert res["cached"] >= 20 - warm_up  # every later step was served from the compilation cache
    assert all(loss == loss for loss in res["losses"])  # finite, not NaN


def test_save_and_load_state_continue_exactly(tmp_path):
    exact = ["--semantics", "acc"]  # exact resume: the data continue at the saved batch
    acc_launch(tmp_path, WORKERS / "resume.py", ["--out", str(tmp_path / "straight"), "--steps", "12"], launch=exact)
    acc_launch(tmp_path, WORKERS / "resume.py", ["--out", str(tmp_path / "a"), "--steps", "5",
                                                 "--save", str(tmp_path / "ckpt")], launch=exact)
    acc_launch(tmp_path, WORKERS / "resume.py", ["--out", str(tmp_path / "b"), "--steps", "7",
                                                 "--load", str(tmp_path / "ckpt")], launch=exact)
    straight, a, b = (read_rank_results(tmp_path / n)[0] for n in ("straight", "a", "b"))
    assert straight["weights"] == b["weights"]  # bitwise, dropout on the device included
    assert straight["adam"] == b["adam"]
    assert straight["seen"] == a["seen"] + b["seen"]  # the data continue with the next batch
    assert straight["rand"] == b["rand"] and straight["lr"] == b["lr"]
    assert b["count"] == 12 and b["step"] == 12
    from safetensors.torch import load_file

    saved = load_file(str(tmp_path / "ckpt" / "model_0.safetensors"))
    assert saved and all(t.device.type == "cpu" for t in saved.values())
    assert {p.name for p in (tmp_path / "ckpt").iterdir()} == {
        "model_0.safetensors", "optimizer_0.pt", "kernel_state.pt", "custom_0.pt", "rng_state_0.pt", "manifest.json"}


@pytest.mark.parametrize("extra,epochs", [([], 1), (["--iterable"], 1), (["--shuffle", "--epochs", "2"], 2)])
def test_gather_for_metrics_returns_each_sample_once(tmp_path, extra, epochs):
    acc_launch(tmp_path, WORKERS / "eval_gather.py", ["--out", str(tmp_path), "--samples", "82", "--batch", "16",
                                                      *extra])
    res = read_rank_results(tmp_path)[0]
    assert len(res["gathered"]) == epochs
    for gathered, objects in zip(res["gathered"], res["objects"]):
        expected = list(range(82))
        assert (gathered if "--shuffle" not in extra else sorted(gathered)) == expected
        assert sorted(objects, key=lambda s: int(s[2:])) == [f"id{i}" for i in expected]
    if "--shuffle" in extra:
        assert res["gathered"][0] != res["gathered"][1]


def test_accumulation_clipping_and_schedules_match_the_cpu_backend(tmp_path):
    args = ["--batch", "4", "--accum", "3", "--clip", "0.5"]
    acc_launch(tmp_path, WORKERS / "loop_semantics.py", ["--out", str(tmp_path / "xla"), *args])
    acc_launch(tmp_path, WORKERS / "loop_semantics.py", ["--out", str(tmp_path / "cpu"), *args], backend="cpu")
    xla, cpu = read_rank_results(tmp_path / "xla")[0], read_rank_results(tmp_path / "cpu")[0]
    assert xla["syncs"] == cpu["syncs"] == [False, False, True] * 8 and xla["steps"] == cpu["steps"] == 8
    assert xla["lrs"] == cpu["lrs"]
    assert max(cpu["norms"]) > 0.5  # clipping was exercised
    assert torch.allclose(torch.tensor(xla["norms"]), torch.tensor(cpu["norms"]), rtol=1e-4)
    assert torch.allclose(torch.tensor(xla["weights"]), torch.tensor(cpu["weights"]), rtol=1e-4, atol=1e-6)


def test_bf16_trains_under_autocast_on_the_device(tmp_path):
    acc_launch(tmp_path, WORKERS / "loop_semantics.py", ["--out", str(tmp_path / "bf16"), "--batch", "8"],
               launch=["--mixed-precision", "bf16"])
    acc_launch(tmp_path, WORKERS / "loop_semantics.py", ["--out", str(tmp_path / "cpu"), "--batch", "8"],
               backend="cpu", launch=["--mixed-precision", "bf16"])
    bf16, cpu = read_rank_results(tmp_path / "bf16")[0], read_rank_results(tmp_path / "cpu")[0]
    weights = torch.tensor(bf16["weights"])
    assert torch.isfinite(weights).all() and bf16["steps"] == 12
    assert torch.allclose(weights, torch.tensor(cpu["weights"]), rtol=0.05, atol=0.02)  # bf16 rounding apart


def test_exit_codes_and_tracebacks_are_the_scripts_own(tmp_path):
    script = tmp_path / "job.py"
    script.write_text("import sys\nfrom acc import Accelerator\naccelerator = Accelerator()\n"
                      "if sys.argv[1] == 'raise':\n    raise RuntimeError('broke on ' + str(accelerator.device))\n"
                      "sys.exit(int(sys.argv[1]))\n")
    acc_launch(tmp_path, script, ["3"], expect=3)
    proc = acc_launch(tmp_path, script, ["raise"], expect=1)
    assert "RuntimeError: broke on xla:0" in proc.stderr
    assert f'Traceback (most recent call last):\n  File "{script}", line 5' in proc.stderr
    assert "xla_multiprocessing" not in proc.stderr


def test_plain_python_with_the_backend_from_the_environment(tmp_path):
    proc = run([sys.executable, str(WORKERS / "train_mlp.py"), "--out", str(tmp_path), "--samples", "16"], tmp_path,
               env=clean_env(tmp_path, ACC_BACKEND="xla"), timeout=300)
    assert proc.returncode == 0, proc.stderr
    res = read_rank_results(tmp_path)[0]
    assert res["backend"] == "xla" and res["device"] == "xla:0"


def test_env_reports_the_xla_device(tmp_path):
    proc = run([ACC, "env"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    import torch_xla

    out = proc.stdout
    assert f"torch_xla              {torch_xla.__version__}" in out
    assert "PJRT device type       CPU" in out and "xla devices            CPU:0" in out


def test_acc_check_passes_on_the_xla_backend(tmp_path):
    proc = run([ACC, "check", "--backend", "xla"], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") >= 6 and "FAIL" not in proc.stdout
