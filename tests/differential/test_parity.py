"""Accelerate-written scripts train identically on acc: same samples per rank per step, same LR at every step,
same weights and optimizer state (fp32 on CPU, 1e-6), same evaluation, also after save_state/load_state.

Each case runs tests/differential/scripts/train.py with Hugging Face Accelerate 1.15 and with acc (its imports
changed by `acc migrate --write`) and compares every rank's record (see harness.compare).
"""

from __future__ import annotations

import pytest

from tests.differential.harness import compare, migrated, start_acc, start_accelerate, together

pytestmark = pytest.mark.slow

CASES = {
    # shuffled, accumulation 2, clipping, a linear schedule sized from the unprepared loader, dropout
    "basic-1": (1, ["--accum", "2", "--clip", "1.0"]),
    "basic-2": (2, ["--accum", "2", "--clip", "1.0"]),
    "split-batches-onecycle": (2, ["--split-batches", "--scheduler", "onecycle"]),
    "uneven-batches": (2, ["--uneven", "--samples", "38", "--eval-samples", "16"]),
    "drop-last-accum-3": (2, ["--drop-last", "--accum", "3"]),
    "seedable-1": (1, ["--seedable"]),
    "seedable-2": (2, ["--seedable", "--accum", "3"]),
    "bf16-autocast": (2, ["--mixed-precision", "bf16", "--clip", "0.5"]),
    "fp16-on-cpu": (1, ["--mixed-precision", "fp16"]),  # Accelerate trains float32 on the CPU; so does acc
    "iterable-dispatched-1": (1, ["--data", "iterable"]),
    "iterable-dispatched-2": (2, ["--data", "iterable", "--accum", "2"]),
    "iterable-sharded": (2, ["--data", "iterable", "--no-dispatch"]),
    "iterable-sized-split": (2, ["--data", "iterable-sized", "--split-batches"]),
    "batch-sampler": (2, ["--data", "batch-sampler"]),
    "sampler-is-batch-sampler": (2, ["--data", "sampler-is-batch-sampler"]),
    "scheduler-every-call": (2, ["--step-scheduler-with-optimizer", "0", "--accum", "2"]),
    "loader-workers": (2, ["--workers", "2", "--epochs", "1"]),
}


@pytest.mark.parametrize("case", list(CASES))
def test_trains_identically(case, accelerate_python, migrated_dir, tmp_path):
    nproc, args = CASES[case]
    script = migrated("train.py", migrated_dir)
    reference, got = together(
        lambda: start_accelerate(accelerate_python, "train.py", args, nproc, tmp_path / "accelerate", tmp_path),
        lambda: start_acc(script, args, nproc, tmp_path / "acc", tmp_path))
    assert not compare(reference, got), "\n".join(compare(reference, got))
    assert reference[0]["steps"], "the script trained no step: the comparison would prove nothing"


@pytest.mark.parametrize("nproc", [1, 2])
def test_resume_mid_epoch_trains_identically(nproc, accelerate_python, migrated_dir, tmp_path):
    """save_state after 5 batches of epoch 0, then a new run: load_state, skip_first_batches(5), train on."""
    args = ["--accum", "2", "--clip", "1.0"]
    script = migrated("train.py", migrated_dir)
    ref_saved, acc_saved = together(
        lambda: start_accelerate(accelerate_python, "train.py", [*args, "--save-at", "5"], nproc, tmp_path / "r1",
                                 tmp_path),
        lambda: start_acc(script, [*args, "--save-at", "5"], nproc, tmp_path / "a1", tmp_path))
    assert not compare(ref_saved, acc_saved), "\n".join(compare(ref_saved, acc_saved))
    reference, got = together(
        lambda: start_accelerate(accelerate_python, "train.py", [*args, "--resume", str(tmp_path / "r1" / "ckpt")],
                                 nproc, tmp_path / "r2", tmp_path),
        lambda: start_acc(script, [*args, "--resume", str(tmp_path / "a1" / "ckpt")], nproc, tmp_path / "a2",
                          tmp_path))
    assert not compare(reference, got), "\n".join(compare(reference, got))
    first = got[0]["steps"][0]
    assert (first["epoch"], first["step"]) == (0, 5), "the resumed run starts with batch 5 of epoch 0"


@pytest.mark.parametrize("nproc", [1, 2])
def test_collectives_return_what_accelerate_returns(nproc, accelerate_python, migrated_dir, tmp_path):
    """gather (a parameter and a loss, which require grad; 0-d; nested), gather_object, reduce with every
    reduction and scale=, pad_across_processes, broadcast (in place), broadcast_object_list,
    split_between_processes, the free functions of accelerate.utils: the same values, shapes and dtypes."""
    script = migrated("collectives.py", migrated_dir)
    reference, got = together(
        lambda: start_accelerate(accelerate_python, "collectives.py", [], nproc, tmp_path / "accelerate", tmp_path),
        lambda: start_acc(script, [], nproc, tmp_path / "acc", tmp_path))
    # the one deliberate difference (docs/guides/migrating-from-accelerate.md): gather_object of an object that is
    # not a list. Accelerate 1.15 iterates it (a dict gives its keys, a string its characters); acc keeps each
    # process's object whole
    if nproc == 2:
        assert reference[0]["gather_object_dict"] == ["rank", "rank"]
        assert got[0]["gather_object_dict"] == [{"rank": 0}, {"rank": 1}]
    for ranks in (reference, got):
        for record in ranks.values():
            record.pop("gather_object_dict")
    assert not compare(reference, got), "\n".join(compare(reference, got))
    if nproc == 2:
        assert got[0]["gather_parameter"]["shape"] == [4, 3] and not got[0]["gather_parameter"]["requires_grad"]
        assert got[0]["gather_loss"]["shape"] == [2]


@pytest.mark.parametrize("case", ["fp32", "bf16-accum"])
def test_two_models_two_optimizers_train_identically(case, accelerate_python, migrated_dir, tmp_path):
    args = [] if case == "fp32" else ["--mixed-precision", "bf16", "--accum", "2"]
    script = migrated("two_models.py", migrated_dir)
    reference, got = together(
        lambda: start_accelerate(accelerate_python, "two_models.py", args, 2, tmp_path / "accelerate", tmp_path),
        lambda: start_acc(script, args, 2, tmp_path / "acc", tmp_path))
    assert not compare(reference, got), "\n".join(compare(reference, got))


SHARDED = {
    "fsdp": ["--fsdp-wrap", "min_params=64"],
    "deepspeed": ["--zero-stage", "2"],
}


@pytest.mark.parametrize("backend", list(SHARDED))
def test_sharded_backends_train_as_ddp_does(backend, migrated_dir, tmp_path):
    """Accelerate cannot run FSDP or DeepSpeed on CPUs (with cpu=True it falls back to DDP), so the sharded
    backends are compared with acc's ddp, which the tests above prove identical to Accelerate: the same samples
    per rank per step and the same LR (exactly), losses and weights to 1e-5 (sharded reductions add in
    another order)."""
    args = ["--accum", "2", "--clip", "1.0", "--dropout", "0.0"]
    script = migrated("train.py", migrated_dir)
    ddp, sharded = together(
        lambda: start_acc(script, args, 2, tmp_path / "ddp", tmp_path),
        lambda: start_acc(script, args, 2, tmp_path / backend, tmp_path, backend=backend,
                          flags=tuple(SHARDED[backend])))
    if backend == "deepspeed":
        # the engine computes the norm inside its step, so clip_grad_norm_ returns the previous step's norm, as
        # with Accelerate's DeepSpeed (get_global_grad_norm): compare it one synchronising step later
        ref_norms = [s["norm"] for s in ddp[0]["steps"] if s["norm"] is not None]
        ds_norms = [s["norm"] for s in sharded[0]["steps"] if s["sync"]]
        assert ds_norms[1:] == pytest.approx(ref_norms[:-1], rel=1e-5)
    for ranks in (ddp, sharded):
        for record in ranks.values():
            record.pop("exp_avg")  # the sharded optimizers keep their state in their own layout
            record.pop("accuracy")  # an argmax may flip on a 1e-6 difference; eval_ids are compared
            if backend == "deepspeed":
                for step in record["steps"]:
                    step.pop("norm")
    assert not compare(ddp, sharded, tol=1e-5), "\n".join(compare(ddp, sharded, tol=1e-5))
    assert ddp[0]["weights"], "the main process recorded the full weights"


@pytest.mark.parametrize("nproc", [1, 2])
def test_inference_with_partial_state_alone(nproc, accelerate_python, migrated_dir, tmp_path):
    """PartialState() without an Accelerator sets the run up (the process group on 2 processes), and its
    split_between_processes, gather_object, main_process_first, on_main_process and repr are Accelerate's."""
    script = migrated("inference.py", migrated_dir)
    reference, got = together(
        lambda: start_accelerate(accelerate_python, "inference.py", [], nproc, tmp_path / "accelerate", tmp_path),
        lambda: start_acc(script, [], nproc, tmp_path / "acc", tmp_path))
    # a difference of spelling only (docs/guides/migrating-from-accelerate.md): Accelerate says cpu:0 there
    for record in reference.values():
        if nproc == 2:
            assert record["device"] == "cpu:0"
        record["device"] = "cpu"
        record["repr"] = record["repr"].replace("Device: cpu:0", "Device: cpu")
    assert not compare(reference, got), "\n".join(compare(reference, got))
    assert got[0]["gathered"] == (["PROMPT 0", "PROMPT 1", "PROMPT 2", "PROMPT 3", "PROMPT 4", "PROMPT 5",
                                   "PROMPT 6", "PROMPT 6"] if nproc == 2 else [f"PROMPT {i}" for i in range(7)])
