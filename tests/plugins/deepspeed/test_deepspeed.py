"""The deepspeed backend with real processes on CPU (DeepSpeed's CPU accelerator, gloo)."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from tests.conftest import ACC, ROOT, WORKERS, clean_env, read_rank_results, run
from tests.plugins.ddp.test_ddp import ACC_SEMANTICS, acc_launch, free_port

pytestmark = pytest.mark.slow
DS = ["--backend", "deepspeed", "--nproc", "2"]


@pytest.fixture(scope="module")
def ddp_reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    acc_launch(tmp, ["--backend", "ddp", "--nproc", "2"], "layers.py", ["--out", str(tmp / "o")])
    return read_rank_results(tmp / "o")


@pytest.mark.parametrize("stage,buckets", [(1, "deepspeed"), (2, "deepspeed"), (3, "deepspeed"), (3, "model")])
def test_zero_stages_match_ddp(tmp_path, ddp_reference, stage, buckets):
    acc_launch(tmp_path, [*DS, "--zero-stage", str(stage), "--zero-buckets", buckets], "layers.py",
               ["--out", str(tmp_path / "o")])
    res = read_rank_results(tmp_path / "o")
    assert res[0]["distributed_type"] == "DEEPSPEED" and len(res[0]["losses"]) == 20
    for a, b in zip(res[0]["losses"], ddp_reference[0]["losses"]):
        assert abs(a - b) <= 1e-4 * abs(b)
    share = res[0]["local_params"] / res[0]["total_params"]
    assert (abs(share - 0.5) < 0.05) if stage == 3 else share == 1.0  # ZeRO-3 partitions the parameters
    masters = res[0]["zero3_masters"]  # fp32 training: the master partition is the parameters' own, not a copy
    assert (masters and all(masters)) if stage == 3 else masters == []


def test_zero3_derived_buckets_by_default_train_as_deepspeeds_sizes_do(tmp_path):
    """zero_buckets auto (the default) sizes ZeRO-3's buckets from the model (its hidden size is known here); the
    losses equal those with DeepSpeed's own sizes within 1e-5."""
    runs = {}
    for buckets in ("auto", "deepspeed"):
        acc_launch(tmp_path, [*DS, "--zero-stage", "3", "--zero-buckets", buckets], "layers.py",
                   ["--out", str(tmp_path / buckets)])
        runs[buckets] = read_rank_results(tmp_path / buckets)[0]["losses"]
    assert len(runs["auto"]) == 20 and all(abs(a - b) <= 1e-5 for a, b in zip(runs["auto"], runs["deepspeed"]))


@pytest.mark.parametrize("choice", ["auto", "native"])
def test_zero_collectives_on_gloo_give_torch_distributed_results(tmp_path, choice):
    """DeepSpeed's all-gathers (asynchronous and in place) and SUM/AVG reduce-scatters, as ZeRO calls them, on 3
    processes: with `auto` on gloo they are acc's p2p collectives, and the results equal torch.distributed's."""
    acc_launch(tmp_path, ["--backend", "deepspeed", "--nproc", "3", "--zero-collectives", choice],
               "zero_collectives.py", ["--out", str(tmp_path / "o")])
    res = read_rank_results(tmp_path / "o")
    assert len(res) == 3 and all(r["p2p"] == (choice == "auto") for r in res.values())
    for r in res.values():
        assert r["gather_error"] == 0 and r["in_place_error"] == 0
        assert r["sum_error"] < 1e-5 and r["avg_error"] < 1e-5


def test_the_same_script_runs_on_cpu_too(tmp_path):
    acc_launch(tmp_path, [], "layers.py", ["--out", str(tmp_path / "o"), "--steps", "3"])
    assert read_rank_results(tmp_path / "o")[0]["world"] == 1


@pytest.mark.parametrize("stage", [2, 3])
def test_resume_in_a_new_launch_continues_exactly(tmp_path, stage):
    flags = [*DS, "--zero-stage", str(stage), *ACC_SEMANTICS]  # exact resume: the data continue by themselves
    acc_launch(tmp_path, flags, "layers.py", ["--out", str(tmp_path / "straight"), "--steps", "16"])
    acc_launch(tmp_path, flags, "layers.py", ["--out", str(tmp_path / "a"), "--steps", "8", "--save",
                                              str(tmp_path / "ckpt")])
    acc_launch(tmp_path, flags, "layers.py", ["--out", str(tmp_path / "b"), "--steps", "8", "--load",
                                              str(tmp_path / "ckpt")])
    straight, b = read_rank_results(tmp_path / "straight"), read_rank_results(tmp_path / "b")
    assert straight[0]["losses"][8:] == b[0]["losses"] and straight[0]["eval_loss"] == b[0]["eval_loss"]


def test_save_model_gathers_zero3_weights_for_the_plain_model(tmp_path):
    acc_launch(tmp_path, [*DS, "--zero-stage", "3"], "layers.py", ["--out", str(tmp_path / "o"), "--steps", "4",
                                                                   "--save-model", str(tmp_path / "m")])
    sys.path.insert(0, str(WORKERS))
    from layers import build

    model = build()
    model.load_state_dict(load_file(str(tmp_path / "m" / "model.safetensors")), strict=True)
    assert all(p.abs().sum() > 0 for p in model.parameters())  # real weights, not empty ZeRO-3 placeholders


@pytest.mark.parametrize("stage", [2, 3])
def test_merge_weights_reads_the_zero_checkpoint_into_the_plain_model(tmp_path, stage):
    """`acc merge-weights` on a deepspeed checkpoint: the backend that saved it reads DeepSpeed's ZeRO files
    (acc_merge_weights); the result equals the weights save_model gathered at the same moment."""
    acc_launch(tmp_path, [*DS, "--zero-stage", str(stage)], "layers.py",
               ["--out", str(tmp_path / "o"), "--steps", "4", "--save", str(tmp_path / "ckpt"),
                "--save-model", str(tmp_path / "m")])
    merged_run = run([ACC, "merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged.safetensors")], tmp_path,
                     timeout=300)
    assert merged_run.returncode == 0, merged_run.stderr
    assert '"backend": "deepspeed"' in merged_run.stdout
    merged, saved = load_file(str(tmp_path / "merged.safetensors")), load_file(str(tmp_path / "m" / "model.safetensors"))
    assert sorted(merged) == sorted(saved)
    assert all(torch.equal(merged[k].float(), saved[k].float()) for k in saved)


def test_accumulation_boundaries_agree_with_acc(tmp_path):
    acc_launch(tmp_path, [*DS, "--zero-stage", "2", *ACC_SEMANTICS], "loop_semantics.py",
               ["--out", str(tmp_path / "acc"), "--batch", "4", "--accum", "3"])
    acc_launch(tmp_path, ACC_SEMANTICS, "loop_semantics.py", ["--out", str(tmp_path / "big"), "--batch", "24"])
    ds, big = read_rank_results(tmp_path / "acc"), read_rank_results(tmp_path / "big")
    assert ds[0]["steps"] == big[0]["steps"] == 4 and ds[0]["lrs"] == big[0]["lrs"]
    assert torch.allclose(torch.tensor(ds[0]["weights"]), torch.tensor(big[0]["weights"]), rtol=1e-5, atol=1e-6)


def test_clipping_happens_in_the_engine_with_the_configured_norm(tmp_path):
    acc_launch(tmp_path, [*DS, "--zero-stage", "2", "--gradient-clipping", "0.5", *ACC_SEMANTICS], "loop_semantics.py",
               ["--out", str(tmp_path / "ds"), "--batch", "8", "--clip", "0.5"])
    acc_launch(tmp_path, ACC_SEMANTICS, "loop_semantics.py", ["--out", str(tmp_path / "one"), "--batch", "16",
                                                              "--clip", "0.5"])
    ds, one = read_rank_results(tmp_path / "ds"), read_rank_results(tmp_path / "one")
    assert torch.allclose(torch.tensor(ds[0]["weights"]), torch.tensor(one[0]["weights"]), rtol=1e-5, atol=1e-6)
    # the engine's norm is known after its step: the reported norms trail the single-process ones by a step
    assert torch.allclose(torch.tensor(ds[0]["norms"][1:]), torch.tensor(one[0]["norms"][:-1]), rtol=1e-4)
    # with nothing configured, the script's own clip_grad_norm_ sets the engine's clipping: same result as above
    acc_launch(tmp_path, [*DS, "--zero-stage", "2", *ACC_SEMANTICS], "loop_semantics.py",
               ["--out", str(tmp_path / "code"), "--batch", "8", "--clip", "0.5"])
    assert read_rank_results(tmp_path / "code")[0]["weights"] == ds[0]["weights"]
    proc = run([ACC, "launch", *DS, "--gradient-clipping", "0.5", str(WORKERS / "loop_semantics.py"), "--out",
                str(tmp_path / "x"), "--clip", "1.0"], tmp_path)
    assert proc.returncode == 1 and "configured gradient_clipping (0.5); clip_grad_norm_ asked for 1.0" in proc.stderr


def test_contradicting_accumulation_and_bad_stage_are_clear_errors(tmp_path):
    (tmp_path / "ds.json").write_text(json.dumps({"gradient_accumulation_steps": 4}))
    proc = run([ACC, "launch", *DS, "--deepspeed-config", "ds.json", "--gradient-accumulation-steps", "2",
                str(WORKERS / "layers.py"), "--out", "o"], tmp_path)
    assert proc.returncode == 2
    assert "ds.json sets gradient_accumulation_steps = 4, but acc's is 2 (gradient_accumulation_steps from flag " \
           "--gradient-accumulation-steps)" in proc.stderr
    proc = run([ACC, "launch", *DS, "--zero-stage", "5", str(WORKERS / "layers.py")], tmp_path)
    assert proc.returncode == 2 and "flag --zero-stage: expected an integer from 0 to 3, got '5'" in proc.stderr
    (tmp_path / "ds7.json").write_text(json.dumps({"zero_optimization": {"stage": 7}}))
    proc = run([ACC, "launch", *DS, "--deepspeed-config", "ds7.json", str(WORKERS / "layers.py")], tmp_path)
    assert proc.returncode == 2 and "ZeRO stage 7 is not one of 0, 1, 2, 3" in proc.stderr


def test_a_frozen_teacher_is_fine_and_two_trained_models_are_refused(tmp_path):
    script = tmp_path / "two.py"
    script.write_text(
        "import sys, torch\nfrom torch.utils.data import DataLoader, TensorDataset\nfrom acc import Accelerator\n"
        "a = Accelerator()\nstudent, teacher = torch.nn.Linear(4, 1), torch.nn.Linear(4, 1)\n"
        "if sys.argv[1] == 'frozen':\n    teacher.requires_grad_(False)\n"
        "dl = DataLoader(TensorDataset(torch.randn(16, 4)), batch_size=4)\n"
        "opt = torch.optim.SGD(student.parameters(), lr=0.1)\n"
        "student, teacher, opt, dl = a.prepare(student, teacher, opt, dl)\n"
        "for (x,) in dl:\n    loss = (student(x) - teacher(x)).pow(2).mean()\n    a.backward(loss)\n"
        "    opt.step()\n    opt.zero_grad()\na.print('ok', a.unwrap_model(student) is not student)\n"
    )
    ok = run([ACC, "launch", *DS, str(script), "frozen"], tmp_path)
    assert ok.returncode == 0, ok.stderr
    assert "ok True" in ok.stdout
    bad = run([ACC, "launch", *DS, str(script), "trained"], tmp_path)
    assert bad.returncode == 1 and "trains one model per Accelerator" in bad.stderr
    assert "frozen" in bad.stderr


class Evil:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(MARK[0]),))


MARK = [""]


def test_loading_never_runs_code_from_a_deepspeed_file(tmp_path):
    from acc.checkpointing.files import digest

    acc_launch(tmp_path, [*DS, "--zero-stage", "2"], "layers.py", ["--out", str(tmp_path / "o"), "--steps", "2",
                                                                   "--save", str(tmp_path / "ckpt")])
    manifest = json.loads((tmp_path / "ckpt" / "manifest.json").read_text())
    target = next(n for n in manifest["files"] if n.endswith("zero_pp_rank_0_mp_rank_00_optim_states.pt"))
    MARK[0] = str(tmp_path / "pwned")
    (tmp_path / "ckpt" / target).write_bytes(pickle.dumps({"x": Evil()}))
    manifest["files"][target] = digest(tmp_path / "ckpt" / target)
    (tmp_path / "ckpt" / "manifest.json").write_text(json.dumps(manifest))
    proc = run([ACC, "launch", *DS, "--zero-stage", "2", str(WORKERS / "layers.py"), "--out", "x", "--load",
                str(tmp_path / "ckpt")], tmp_path)
    assert proc.returncode != 0 and "refused or unreadable" in proc.stderr
    assert not (tmp_path / "pwned").exists()


def test_acc_check_passes_on_deepspeed(tmp_path):
    proc = run([ACC, "check", *DS, "--zero-stage", "3"], tmp_path, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.count("PASS") == 8


def test_two_machines_through_the_same_agent_settings(tmp_path):
    port = str(free_port())
    common = [*DS[:2], "--nproc", "1", "--num-machines", "2", "--main-process-ip", "127.0.0.1", "--main-process-port",
              port, "--zero-stage", "2"]
    procs = [subprocess.Popen([ACC, "launch", *common, "--machine-rank", str(r), str(WORKERS / "layers.py"), "--out",
                               str(tmp_path / "o"), "--steps", "3"], cwd=tmp_path, env=clean_env(tmp_path),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    res = read_rank_results(tmp_path / "o")
    assert sorted(res) == [0, 1] and res[0]["world"] == 2 and res[0]["losses"] == res[1]["losses"]


def test_dry_run_shows_the_deepspeed_plan(tmp_path):
    proc = run([ACC, "launch", *DS, "--zero-stage", "3", "--offload-optimizer", "cpu", "--dry-run",
                str(ROOT / "examples" / "quickstart.py")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "note: ZeRO stage 3" in proc.stdout and "DS_ACCELERATOR=cpu" in proc.stdout
    assert "offload_optimizer            cpu           flag --offload-optimizer" in proc.stdout
    # the derived default says what it is derived from
    assert "bucket sizes the config leaves out: auto (from the model's hidden size, found at prepare" in proc.stdout
    proc = run([ACC, "launch", *DS, "--zero-buckets", "deepspeed", "--dry-run",
                str(ROOT / "examples" / "quickstart.py")], tmp_path)
    assert "bucket sizes the config leaves out: DeepSpeed's defaults" in proc.stdout, proc.stdout
