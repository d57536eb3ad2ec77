"""ParallelismConfig (acc.parallelism_config): Accelerate's fields, environment variables and checks, and a real
device mesh on 2 processes (gloo)."""

from __future__ import annotations

import pytest

import acc
from acc.parallelism_config import ParallelismConfig


def test_the_mesh_holds_the_dimensions_above_one_outermost_first(monkeypatch):
    config = ParallelismConfig(dp_replicate_size=2, dp_shard_size=2, cp_size=2)
    assert config._get_mesh() == (("dp_replicate", "dp_shard", "cp"), (2, 2, 2))
    assert config.total_size == 8 and config.data_parallel_size == 4 and config.non_data_parallel_size == 2
    assert config.dp_dim_names == ["dp_replicate", "dp_shard"] and config.dp_cp_dim_names == ["dp_replicate", "dp_shard", "cp"]
    assert config.fsdp_dim_names == ["dp_replicate", "dp_shard_cp"]
    assert config.cp_handler.cp_comm_strategy == "allgather"
    assert ParallelismConfig()._get_mesh() == () and ParallelismConfig().build_device_mesh("cpu") is None
    monkeypatch.setenv("PARALLELISM_CONFIG_DP_SHARD_SIZE", "4")
    monkeypatch.setenv("PARALLELISM_CONFIG_CP_COMM_STRATEGY", "alltoall")
    config = ParallelismConfig(cp_size=2)
    assert config.dp_shard_size == 4 and config.cp_handler.cp_comm_strategy == "alltoall"


@pytest.mark.parametrize("kwargs,message", [
    ({"tp_size": 0}, "tp_size must be at least 1, but got 0"),
    ({"cp_size": 2, "sp_size": 2}, "exclude each other"),
    ({"dp_replicate_size": 2, "cp_size": 2}, "does not compose with pure replication"),
    ({"cp_backend": "ring"}, "cp_backend must be one of"),
])
def test_bad_sizes_are_refused_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ParallelismConfig(**kwargs)


def _mesh_facts():
    import torch.distributed as dist

    dist.init_process_group("gloo")
    try:
        mesh = ParallelismConfig(dp_shard_size=2).build_device_mesh("cpu")
        return mesh.mesh_dim_names, mesh["dp"].size(), mesh["dp_shard_cp"].size(), dist.get_rank()
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_a_real_mesh_on_two_processes_has_the_flattened_dimensions():
    results = acc.launch(_mesh_facts, backend="ddp", nproc=2, return_all=True, output_dir="")
    assert [r[:3] for r in results] == [(("dp_shard",), 2, 2)] * 2 and sorted(r[3] for r in results) == [0, 1]
