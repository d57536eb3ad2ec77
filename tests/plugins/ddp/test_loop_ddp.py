"""Loop semantics across real processes: accumulation with no_sync, schedulers, clipping (ddp on gloo)."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import read_rank_results
from tests.plugins.ddp.test_ddp import ACC_SEMANTICS, DDP2, acc_launch

pytestmark = pytest.mark.slow


def test_accumulation_matches_one_big_step_and_really_skips_sync(tmp_path):
    # 2 processes x batch 4 x 3 micro-steps = 24 samples per optimizer step, 4 optimizer steps
    acc_launch(tmp_path, [*DDP2, *ACC_SEMANTICS], "loop_semantics.py", ["--out", str(tmp_path / "acc"), "--batch", "4",
                                                                        "--accum", "3"])
    acc_launch(tmp_path, ACC_SEMANTICS, "loop_semantics.py", ["--out", str(tmp_path / "big"), "--batch", "24"])
    ddp, big = read_rank_results(tmp_path / "acc"), read_rank_results(tmp_path / "big")
    assert ddp[0]["steps"] == big[0]["steps"] == 4
    assert torch.allclose(torch.tensor(ddp[0]["weights"]), torch.tensor(big[0]["weights"]), rtol=1e-5, atol=1e-6)
    assert ddp[0]["syncs"] == [False, False, True] * 4
    for i, sync in enumerate(ddp[0]["syncs"]):
        same = ddp[0]["grads"][i] == ddp[1]["grads"][i]
        assert same == sync, f"micro-step {i}: gradients {'differ' if sync else 'agree'} across ranks"


def test_scheduler_steps_once_per_process_by_default_and_once_with_acc_semantics(tmp_path):
    acc_launch(tmp_path, DDP2, "loop_semantics.py", ["--out", str(tmp_path / "default"), "--batch", "4", "--accum", "3"])
    acc_launch(tmp_path, [*DDP2, "--scheduler-stepping", "once"], "loop_semantics.py",
               ["--out", str(tmp_path / "once"), "--batch", "4", "--accum", "3"])
    acc_launch(tmp_path, ACC_SEMANTICS, "loop_semantics.py", ["--out", str(tmp_path / "one"), "--batch", "24"])
    default, once, one = (read_rank_results(tmp_path / n) for n in ("default", "once", "one"))
    # Accelerate's rule: num_processes scheduler steps per optimizer step (2 here), as its scripts expect
    assert default[0]["lrs"] == default[1]["lrs"] == pytest.approx([0.05 / 3, 0.05 / 5, 0.05 / 7, 0.05 / 9])
    # acc's rule: one per applied optimizer step, the same schedule as on one process
    assert once[0]["lrs"] == once[1]["lrs"] == one[0]["lrs"]
    assert one[0]["lrs"] == pytest.approx([0.05 / 2, 0.05 / 3, 0.05 / 4, 0.05 / 5])


def test_clipping_reports_the_global_norm(tmp_path):
    acc_launch(tmp_path, [*DDP2, *ACC_SEMANTICS], "loop_semantics.py", ["--out", str(tmp_path / "ddp"), "--batch", "8",
                                                                        "--clip", "0.5"])
    acc_launch(tmp_path, ACC_SEMANTICS, "loop_semantics.py", ["--out", str(tmp_path / "one"), "--batch", "16", "--clip",
                                                              "0.5"])
    ddp, one = read_rank_results(tmp_path / "ddp"), read_rank_results(tmp_path / "one")
    assert ddp[0]["norms"] == ddp[1]["norms"]
    assert torch.allclose(torch.tensor(ddp[0]["norms"]), torch.tensor(one[0]["norms"]), rtol=1e-5)
    assert max(one[0]["norms"]) > 0.5  # clipping was really exercised
    assert torch.allclose(torch.tensor(ddp[0]["weights"]), torch.tensor(one[0]["weights"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_mixed_precision_runs_on_two_processes(tmp_path, mode):
    acc_launch(tmp_path, [*DDP2, "--mixed-precision", mode], "loop_semantics.py", ["--out", str(tmp_path),
                                                                                  "--batch", "8"])
    results = read_rank_results(tmp_path)
    assert results[0]["weights"] == results[1]["weights"]


def test_dynamo_backend_compiles_prepared_models_and_trains_the_same(tmp_path):
    """--dynamo-backend (Accelerate's --dynamo_backend): prepared models run through torch.compile after the
    DDP wrapping; the result equals eager mode to 1e-5."""
    eager = [*DDP2, *ACC_SEMANTICS]
    acc_launch(tmp_path, eager, "loop_semantics.py", ["--out", str(tmp_path / "eager"), "--batch", "8"])
    acc_launch(tmp_path, [*eager, "--dynamo-backend", "aot_eager"], "loop_semantics.py",
               ["--out", str(tmp_path / "compiled"), "--batch", "8", "--report-compiled"])
    e, c = read_rank_results(tmp_path / "eager"), read_rank_results(tmp_path / "compiled")
    assert c[0]["compiled"] and not e[0]["compiled"]
    assert torch.allclose(torch.tensor(e[0]["weights"]), torch.tensor(c[0]["weights"]), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("backend", [["--backend", "ddp", "--nproc", "2"], ["--backend", "cpu"]], ids=["ddp", "cpu"])
def test_regional_compilation_compiles_the_repeated_blocks_and_trains_the_same(tmp_path, backend):
    """TorchDynamoPlugin(use_regional_compilation=True): the model's repeated blocks (its two Blocks) are each
    compiled in place, on any backend; the losses equal eager mode's to 1e-5."""
    acc_launch(tmp_path, backend, "layers.py", ["--out", str(tmp_path / "eager")])
    acc_launch(tmp_path, [*backend, "--dynamo-backend", "aot_eager"], "layers.py",
               ["--out", str(tmp_path / "regional"), "--regional"])
    eager, regional = read_rank_results(tmp_path / "eager"), read_rank_results(tmp_path / "regional")
    assert regional[0]["compiled_modules"] == ["Block", "Block"] and not regional[0]["compiled_whole"]
    for a, b in zip(regional[0]["losses"], eager[0]["losses"], strict=True):
        assert abs(a - b) <= 1e-5 * abs(b)
