"""N-D parallelism on the fsdp backend with real processes on gloo: tensor parallel (a TP plan on the mesh's tp dim),
TP x FSDP, HSDP and HSDP x TP, each against the single-process run of the same model and data
(tests/workers/tensor_parallel.py: 3 AdamW steps with gradient clipping), and a checkpoint resumed across mesh
shapes. The plan's resolution and its errors are checked in process."""

from __future__ import annotations

import json
import sys

import pytest
import torch
from torch import nn

from acc import AccError
from tests.conftest import WORKERS, read_rank_results
from tests.plugins.ddp.test_ddp import acc_launch

TOL = 1e-5


def _reference(steps: int) -> tuple[dict, list[float]]:
    sys.path.insert(0, str(WORKERS))
    from tensor_parallel import reference

    return reference(steps)


def _train(tmp_path, name: str, nproc: int, sizes: list[str], *extra: str, flags: tuple[str, ...] = ()) -> dict:
    """The worker's run (`extra`: its arguments; `flags`: more launch flags), its ranks' results and weights."""
    out = tmp_path / name
    acc_launch(tmp_path, ["--backend", "fsdp", "--nproc", str(nproc), *flags], "tensor_parallel.py",
               ["--out", str(out), *(["--sizes", *sizes] if sizes else []), *extra])
    ranks = read_rank_results(out)
    assert sorted(ranks) == list(range(nproc)), ranks
    return {"ranks": ranks, "weights": torch.load(out / "weights.pt")}


def _max_diff(got: dict, want: dict) -> float:
    assert sorted(got) == sorted(want)
    return max(float((got[k] - want[k]).abs().max()) for k in want)


@pytest.mark.slow
@pytest.mark.parametrize("sizes,nproc,tp", [
    (["tp=2"], 2, 2),
    (["dp_shard=2", "tp=2"], 4, 2),
    (["dp_replicate=2", "dp_shard=2"], 4, 1),
    (["dp_replicate=2", "dp_shard=2", "tp=2"], 8, 2),
], ids=["tp2", "fsdp2xtp2", "hsdp2x2", "hsdp2x2xtp2"])
def test_training_on_the_mesh_matches_one_process(tmp_path, sizes, nproc, tp):
    run = _train(tmp_path, "run", nproc, sizes)
    want, norms = _reference(3)
    diff = _max_diff(run["weights"], want)
    print(f"{' x '.join(sizes)}: max |dw| after 3 steps {diff:.2e}")
    assert diff <= TOL
    ranks = run["ranks"]
    for rank, seen in ranks.items():
        assert all(abs(a - b) <= TOL * max(1.0, b) for a, b in zip(seen["norms"], norms)), (seen["norms"], norms)
        # the ranks of one tp group (consecutive ranks) read the same batches; the dp ranks read different ones
        assert seen["seen"] == ranks[rank - rank % tp]["seen"]
        assert sorted(seen["mesh"]) == sorted(s.split("=")[0] for s in sizes)
    assert len({json.dumps(ranks[r]["seen"]) for r in range(0, nproc, tp)}) == nproc // tp
    for seen in ranks.values():  # gather_for_metrics: each evaluation row once, one copy per tp group
        assert sorted(seen["evaluated"]) == list(range(11)), seen["evaluated"]
        assert sorted(seen["objects"]) == sorted(f"row {i}" for i in range(11)), seen["objects"]
    replicas = [sum(ranks[r]["seen"]) for r in range(0, nproc, tp)]  # each dp rank's batches once
    for seen in ranks.values():
        assert seen["reduced"]["sum"] == pytest.approx([sum(replicas), nproc // tp], abs=1e-9), seen["reduced"]
        assert seen["reduced"]["mean"] == pytest.approx([sum(replicas) / len(replicas), 1.0], abs=1e-9)
        assert seen["reduced"]["max"] == pytest.approx([max(replicas), 1.0], abs=1e-9)
    if tp > 1:  # the plan's Linears are DTensors (the norms and the head are not in the plan)
        assert "blocks.0.up.weight" in ranks[0]["dtensor_params"] and "blocks.1.down.weight" in ranks[0]["dtensor_params"]


@pytest.mark.slow
def test_a_checkpoint_resumes_across_mesh_shapes_to_the_uninterrupted_weights(tmp_path):
    """2 steps on TP 2 x FSDP 2, saved; 2 more on FSDP 4 (4 x 1), saved; 2 more on one process: the weights are
    those of 6 uninterrupted steps on one process."""
    first = _train(tmp_path, "a", 4, ["dp_shard=2", "tp=2"], "--steps", "2", "--save", str(tmp_path / "ck1"))
    second = _train(tmp_path, "b", 4, ["dp_shard=4"], "--first", "2", "--steps", "2", "--load", str(tmp_path / "ck1"),
                    "--save", str(tmp_path / "ck2"))
    third = _train(tmp_path, "c", 1, [], "--first", "4", "--steps", "2", "--load", str(tmp_path / "ck2"))
    for run, steps in ((first, 2), (second, 4), (third, 6)):
        diff = _max_diff(run["weights"], _reference(steps)[0])
        print(f"after {steps} steps: max |dw| against one uninterrupted process {diff:.2e}")
        assert diff <= TOL


@pytest.mark.slow
def test_fsdp_wrap_auto_shards_the_repeated_blocks_and_trains_as_the_root_alone_does(tmp_path):
    """The default (fsdp_wrap auto) makes each of the ModuleList's Blocks a unit; the weights equal those of the
    root-only wrap (Accelerate's NO_WRAP) and of one process."""
    auto = _train(tmp_path, "auto", 2, [])
    root = _train(tmp_path, "root", 2, [], flags=("--fsdp-wrap", "none"))
    assert auto["ranks"][0]["fsdp_units"] == ["<root>", "blocks.0", "blocks.1"]
    assert root["ranks"][0]["fsdp_units"] == ["<root>"]
    want = _reference(3)[0]
    assert _max_diff(auto["weights"], root["weights"]) <= TOL and _max_diff(auto["weights"], want) <= TOL


def test_fsdp_wrap_auto_finds_the_largest_run_of_one_class_holding_half_the_parameters():
    from acc_fsdp.plugin import repeated_blocks

    sys.path.insert(0, str(WORKERS))
    from tensor_parallel import Net

    net = Net()
    assert repeated_blocks(net) == list(net.blocks)
    stack = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.ReLU()) for _ in range(3)])  # the bench model's shape
    assert repeated_blocks(stack) == list(stack)
    mixed = nn.Sequential(nn.Linear(16, 32), nn.Linear(32, 32), nn.Conv1d(32, 4, 1))
    assert repeated_blocks(mixed) == []  # children of two classes: the root alone
    small = nn.Sequential(nn.Linear(64, 64), nn.ModuleList([nn.Linear(2, 2), nn.Linear(2, 2)]))
    assert repeated_blocks(small) == []  # the blocks hold under half of the parameters


# ---------------------------------------------------------------------------------------- the plan, in process


class _Mlp(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 8), nn.Linear(8, 4)) for _ in range(2))


def test_a_plan_resolves_patterns_to_torch_styles_first_match_winning():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    from acc.runtime.tensor_parallel import resolve

    resolved = resolve(_Mlp(), {"blocks.*.0": "colwise", "blocks.1.1": "colwise", "blocks.*.1": "rowwise"})
    assert sorted(resolved) == ["blocks.0.0", "blocks.0.1", "blocks.1.0", "blocks.1.1"]
    assert isinstance(resolved["blocks.0.0"], ColwiseParallel) and isinstance(resolved["blocks.1.1"], ColwiseParallel)
    assert isinstance(resolved["blocks.0.1"], RowwiseParallel)
    given = RowwiseParallel()
    assert resolve(_Mlp(), {"blocks.0.1": given})["blocks.0.1"] is given
    # transformers' plain style names: the output gathered whole, the input given whole
    from torch.distributed.tensor import Replicate

    resolved = resolve(_Mlp(), {"blocks.0.0": "colwise_gather_output", "blocks.0.1": "rowwise_split_input",
                                "blocks.1.*": "embedding_rowwise"})
    assert isinstance(resolved["blocks.0.0"], ColwiseParallel) and resolved["blocks.0.0"].output_layouts == (Replicate(),)
    assert isinstance(resolved["blocks.0.1"], RowwiseParallel) and resolved["blocks.0.1"].input_layouts == (Replicate(),)


def test_a_plan_pattern_matching_nothing_or_an_unknown_style_is_an_error_saying_what_is_valid():
    from acc.runtime.tensor_parallel import resolve, tp_plan_of

    with pytest.raises(AccError, match=r"TP plan pattern '\*\.proj' matches no module of the model; its modules "
                                       r"include: blocks, blocks\.0, blocks\.0\.0"):
        resolve(_Mlp(), {"*.proj": "colwise"})
    with pytest.raises(AccError, match=r"style 'column' is not one of colwise, rowwise, sequence_parallel"):
        resolve(_Mlp(), {"blocks.*.0": "column"})
    with pytest.raises(AccError, match=r"style 'packed_colwise' .* parallelized by transformers: "
                                       r"from_pretrained\(\.\.\., tp_plan='auto'\)"):
        resolve(_Mlp(), {"blocks.*.0": "packed_colwise"})
    model = _Mlp()
    assert tp_plan_of(model) is None
    model._tp_plan = {"blocks.*.0": "colwise"}  # transformers' attribute
    assert tp_plan_of(model) == {"blocks.*.0": "colwise"}
    model.tp_plan = ["blocks.*.0"]
    with pytest.raises(AccError, match="model.tp_plan is a list: a TP plan is a dict"):
        tp_plan_of(model)


def test_context_parallel_on_the_cpu_is_refused_before_launch_with_the_measured_reason(tmp_path):
    from tests.conftest import ACC, ROOT, run

    proc = run([ACC, "launch", "--backend", "fsdp", "--nproc", "2", "--cpu", "--parallelism-config-cp-size", "2",
                str(ROOT / "examples" / "quickstart.py")], tmp_path)
    assert proc.returncode == 2
    assert "ParallelismConfig(cp_size=2): context parallel needs CUDA" in proc.stderr
    assert "_scaled_dot_product_flash_attention_for_cpu) has no DTensor sharding strategy" in proc.stderr
