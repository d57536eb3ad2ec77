"""Accelerator(parallelism_config=ParallelismConfig(...)): checked against the run (the sizes' product against the
processes, each dimension above 1 against the mesh dimensions the backend declares it drives), and its device mesh
built on the run's process group, with real processes on gloo (tests/workers/parallelism_config.py); the refusals
in process."""

from __future__ import annotations

import pytest

from acc import Accelerator, AccError, ParallelismConfig
from acc.contract.capabilities import Capabilities
from tests.conftest import read_rank_results
from tests.plugins.ddp.test_ddp import acc_launch

WORKER = "parallelism_config.py"


def launch(tmp_path, backend: str, name: str, *sizes: str) -> dict[int, dict]:
    out = tmp_path / name
    acc_launch(tmp_path, ["--backend", backend, "--nproc", "2"], WORKER, ["--out", str(out), "--sizes", *sizes])
    results = read_rank_results(out)
    assert sorted(results) == [0, 1], results
    return results


@pytest.mark.slow
@pytest.mark.parametrize("backend,dim,flattened", [("fsdp", "dp_shard", {"dp": 2, "dp_shard_cp": 2, "dp_cp": 2}),
                                                   ("ddp", "dp_replicate", {"dp": 2, "dp_cp": 2})])
def test_the_device_mesh_is_built_on_the_runs_process_group(tmp_path, backend, dim, flattened):
    ranks = launch(tmp_path, backend, backend, f"{dim}=2")
    for rank, seen in ranks.items():
        assert seen["names"] == [dim] and seen["shape"] == [2] and seen["coordinate"] == [rank]
        assert seen["device_type"] == "cpu" and seen["flattened"] == flattened
        assert seen["dp_sum"] == 3.0  # an all_reduce over the dp submesh's group reached both ranks
        assert seen["same_mesh"] and seen["same_config"]  # AcceleratorState shows the same objects


@pytest.mark.slow
def test_a_dimension_the_backend_does_not_drive_is_refused_naming_one_that_does(tmp_path):
    ranks = launch(tmp_path, "fsdp", "refused", "dp_replicate=2")
    assert ranks[0]["error"] == ("ParallelismConfig(dp_replicate_size=2): the fsdp backend drives dp_shard; backends "
                                 "that drive dp_replicate: ddp (acc launch --backend ddp)")


def test_sizes_whose_product_is_not_the_process_count_are_refused_saying_both():
    with pytest.raises(AccError, match=r"dp_shard_size 2 x tp_size 1 x cp_size 1 x sp_size 1 = 2 processes, but "
                                       r"this run has 1: launch 2 processes \(acc launch --nproc 2\)"):
        Accelerator(parallelism_config=ParallelismConfig(dp_shard_size=2))


def test_a_one_process_config_has_no_mesh_and_a_wrong_type_is_refused():
    config = ParallelismConfig()
    accelerator = Accelerator(parallelism_config=config)
    assert accelerator.parallelism_config is config and accelerator.torch_device_mesh is None
    with pytest.raises(TypeError, match="expected an acc.ParallelismConfig"):
        Accelerator(parallelism_config={"tp_size": 1})


def test_capabilities_name_only_known_mesh_dimensions():
    assert Capabilities(mesh_dims=("dp_shard",)).mesh_dims == ("dp_shard",)
    with pytest.raises(ValueError, match=r"\['pp'\] not among dp_replicate, dp_shard, tp, cp, sp"):
        Capabilities(mesh_dims=("pp",))
