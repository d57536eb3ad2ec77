"""The fsdp backend with real processes on gloo: equivalence with ddp, sharding, checkpoints, resharding."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ACC, ROOT, WORKERS, read_rank_results, run
from tests.plugins.ddp.test_ddp import ACC_SEMANTICS, acc_launch

pytestmark = pytest.mark.slow
FSDP2 = ["--backend", "fsdp", "--nproc", "2", "--fsdp-wrap", "transformer_layer=Block"]


def test_losses_match_ddp_and_each_rank_holds_half(tmp_path):
    acc_launch(tmp_path, FSDP2, "layers.py", ["--out", str(tmp_path / "fsdp")])
    acc_launch(tmp_path, ["--backend", "ddp", "--nproc", "2"], "layers.py", ["--out", str(tmp_path / "ddp")])
    fsdp, ddp = read_rank_results(tmp_path / "fsdp"), read_rank_results(tmp_path / "ddp")
    assert fsdp[0]["distributed_type"] == "FSDP" and len(fsdp[0]["losses"]) == 20
    for a, b in zip(fsdp[0]["losses"], ddp[0]["losses"]):
        assert abs(a - b) <= 1e-5 * abs(b)
    total = fsdp[0]["total_params"]
    for rank in (0, 1):
        assert abs(fsdp[rank]["local_params"] / total - 0.5) < 0.05, fsdp[rank]["local_params"]
    assert fsdp[0]["local_params"] + fsdp[1]["local_params"] == total
    assert ddp[0]["local_params"] == total


def test_resume_in_a_new_launch_continues_exactly(tmp_path):
    exact = [*FSDP2, *ACC_SEMANTICS]  # exact resume: the data continue by themselves
    acc_launch(tmp_path, exact, "layers.py", ["--out", str(tmp_path / "straight"), "--steps", "20"])
    acc_launch(tmp_path, exact, "layers.py", ["--out", str(tmp_path / "a"), "--steps", "10",
                                              "--save", str(tmp_path / "ckpt")])
    acc_launch(tmp_path, exact, "layers.py", ["--out", str(tmp_path / "b"), "--steps", "10",
                                              "--load", str(tmp_path / "ckpt")])
    straight, b = read_rank_results(tmp_path / "straight"), read_rank_results(tmp_path / "b")
    assert straight[0]["losses"][10:] == b[0]["losses"]
    assert straight[0]["eval_loss"] == b[0]["eval_loss"]


@pytest.mark.parametrize("nproc", [1, 3])
def test_a_checkpoint_from_two_processes_loads_on_another_count(tmp_path, nproc):
    acc_launch(tmp_path, FSDP2, "layers.py", ["--out", str(tmp_path / "two"), "--save", str(tmp_path / "ckpt")])
    launch = ["--backend", "fsdp", "--nproc", str(nproc), "--fsdp-wrap", "transformer_layer=Block"]
    proc = acc_launch(tmp_path, launch, "layers.py", ["--out", str(tmp_path / "other"), "--load",
                                                      str(tmp_path / "ckpt"), "--eval-only"])
    two, other = read_rank_results(tmp_path / "two"), read_rank_results(tmp_path / "other")
    assert other[0]["world"] == nproc
    assert other[0]["eval_loss"] == pytest.approx(two[0]["eval_loss"], rel=1e-6)
    assert f"saved by 2 process(es); this run has {nproc}" in proc.stderr


def test_save_model_and_merge_weights_give_the_plain_model(tmp_path):
    acc_launch(tmp_path, FSDP2, "layers.py", ["--out", str(tmp_path / "o"), "--save", str(tmp_path / "ckpt"),
                                              "--save-model", str(tmp_path / "model")])
    import sys

    sys.path.insert(0, str(WORKERS))
    from layers import build

    saved = load_file(str(tmp_path / "model" / "model.safetensors"))
    build().load_state_dict(saved, strict=True)
    merged_run = run([ACC, "merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged.safetensors")], tmp_path)
    assert merged_run.returncode == 0, merged_run.stderr
    merged = load_file(str(tmp_path / "merged.safetensors"))
    assert sorted(merged) == sorted(saved) and all(torch.equal(merged[k], saved[k]) for k in saved)


def test_no_split_modules_wraps_the_classes_the_model_names_as_accelerate_does(tmp_path):
    # Accelerate's TRANSFORMER_BASED_WRAP without classes (its nd_parallel example's config) wraps _no_split_modules
    flags = ["--backend", "fsdp", "--nproc", "2", "--fsdp-wrap", "no_split_modules"]
    acc_launch(tmp_path, flags, "layers.py", ["--out", str(tmp_path / "named"), "--steps", "3", "--no-split", "Block"])
    assert read_rank_results(tmp_path / "named")[0]["fsdp_units"] == ["FSDPBlock", "FSDPBlock"]
    proc = run([ACC, "launch", *flags, str(WORKERS / "layers.py"), "--out", str(tmp_path / "none")], tmp_path,
               timeout=180)
    assert proc.returncode != 0
    assert "fsdp_wrap no_split_modules" in proc.stderr and "has no _no_split_modules; name the classes" in proc.stderr


def test_accumulation_without_sync_matches_one_big_step(tmp_path):
    acc_launch(tmp_path, ["--backend", "fsdp", "--nproc", "2", *ACC_SEMANTICS], "loop_semantics.py",
               ["--out", str(tmp_path / "acc"), "--batch", "4", "--accum", "3", "--clip", "0.5"])
    acc_launch(tmp_path, ACC_SEMANTICS, "loop_semantics.py", ["--out", str(tmp_path / "big"), "--batch", "24",
                                                              "--clip", "0.5"])
    fsdp, big = read_rank_results(tmp_path / "acc"), read_rank_results(tmp_path / "big")
    assert torch.allclose(torch.tensor(fsdp[0]["weights"]), torch.tensor(big[0]["weights"]), rtol=1e-5, atol=1e-6)
    assert torch.allclose(torch.tensor(fsdp[0]["norms"]), torch.tensor(big[0]["norms"]), rtol=1e-5)
    assert fsdp[0]["syncs"] == [False, False, True] * 4


def test_min_params_policy_and_bf16_track_fp32(tmp_path):
    for mode in ("no", "bf16"):
        acc_launch(tmp_path, ["--backend", "fsdp", "--nproc", "2", "--fsdp-wrap", "min_params=500",
                              "--mixed-precision", mode], "layers.py", ["--out", str(tmp_path / mode), "--steps", "12"])
    fp32, bf16 = read_rank_results(tmp_path / "no")[0]["losses"], read_rank_results(tmp_path / "bf16")[0]["losses"]
    assert fp32 != bf16  # bf16 really computed in lower precision
    assert max(abs(a - b) / b for a, b in zip(bf16, fp32)) < 0.02  # stated tolerance: 2% per step


def test_acc_check_passes_on_fsdp(tmp_path):
    proc = run([ACC, "check", "--backend", "fsdp", "--nproc", "2"], tmp_path, timeout=180)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 8


@pytest.mark.parametrize("flags,message", [
    (["--mixed-precision", "fp16"], "mixed_precision 'fp16' is not supported by the fsdp backend (it runs no, bf16; "
                                    "fp16 came from flag --mixed-precision)"),
    (["--fsdp-wrap", "layers=Block"], "fsdp_wrap 'layers=Block': expected auto, none, transformer_layer=ClassName"),
    (["--fsdp-strategy", "hybrid_shard"], "'hybrid_shard' replicates across machines"),
])
def test_bad_options_are_refused_before_starting(tmp_path, flags, message):
    proc = run([ACC, "launch", "--backend", "fsdp", "--nproc", "2", *flags, "--dry-run",
                str(ROOT / "examples" / "quickstart.py")], tmp_path)
    assert proc.returncode == 2 and message in proc.stderr


def test_dry_run_lists_fsdp_settings_with_sources(tmp_path):
    (tmp_path / "acc.toml").write_text('[fsdp]\nfsdp_strategy = "shard_grad_op"\n')
    proc = run([ACC, "launch", *FSDP2, "--dry-run", str(ROOT / "examples" / "quickstart.py")], tmp_path,
               env=None)
    assert proc.returncode == 0, proc.stderr
    lines = {ln.split()[0]: ln.split() for ln in proc.stdout.splitlines() if ln.startswith("  fsdp_")}
    assert lines["fsdp_wrap"][1:] == ["transformer_layer=Block", "flag", "--fsdp-wrap"]
    assert lines["fsdp_strategy"][1:4] == ["shard_grad_op", "project", "file"]
    assert "sharding: shard_grad_op, wrap: transformer_layer=Block" in proc.stdout
    env_proc = run([ACC, "launch", "--backend", "fsdp", "--nproc", "2", "--dry-run",
                    str(ROOT / "examples" / "quickstart.py")], tmp_path,
                   env={**__import__("tests.conftest", fromlist=["clean_env"]).clean_env(tmp_path),
                        "ACC_FSDP_CPU_OFFLOAD": "1"})
    assert "fsdp_cpu_offload             True          env ACC_FSDP_CPU_OFFLOAD" in env_proc.stdout


def test_an_optimizer_that_already_stepped_is_refused(tmp_path):
    script = tmp_path / "late.py"
    script.write_text(
        "import torch\nfrom acc import Accelerator\na = Accelerator()\nm = torch.nn.Linear(4, 4)\n"
        "o = torch.optim.Adam(m.parameters())\nm(torch.ones(1, 4)).sum().backward()\no.step()\n"
        "a.prepare(m, o)\n"
    )
    proc = run([ACC, "launch", "--backend", "fsdp", "--nproc", "2", str(script)], tmp_path)
    assert proc.returncode == 1
    assert "already has state for this model's parameters" in proc.stderr


def test_dynamo_backend_compiles_each_sharded_unit_and_trains_like_eager(tmp_path):
    """--dynamo-backend under fsdp: each unit fully_shard was applied to (here the two Blocks, not the root) is
    compiled in place (nn.Module.compile, inductor); the losses equal eager fsdp's to 1e-5."""
    acc_launch(tmp_path, FSDP2, "layers.py", ["--out", str(tmp_path / "eager")])
    acc_launch(tmp_path, [*FSDP2, "--dynamo-backend", "inductor"], "layers.py", ["--out", str(tmp_path / "compiled")])
    eager, compiled = read_rank_results(tmp_path / "eager"), read_rank_results(tmp_path / "compiled")
    assert eager[0]["compiled_modules"] == []
    for rank in (0, 1):
        assert compiled[rank]["compiled_modules"] == ["FSDPBlock", "FSDPBlock"]
        assert not compiled[rank]["compiled_whole"]
    for a, b in zip(compiled[0]["losses"], eager[0]["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)
