"""Accelerator(parallelism_config=ParallelismConfig(...)): checked against the run (the sizes' product against the
processes, each dimension above 1 against the mesh dimensions the backend declares it drives), and its device mesh
built on the run's process group, with real processes on gloo (tests/workers/parallelism_config.py); the refusals
in process."""

from __future__ import annotations

import json

import pytest

from acc import Accelerator, AccError, ParallelismConfig
from acc.contract.capabilities import Capabilities
from tests.conftest import read_rank_results
from tests.plugins.ddp.test_ddp import acc_launch

WORKER = "parallelism_config.py"


def launch(tmp_path, backend: str, name: str, *sizes: str, flags: tuple[str, ...] = ()) -> dict[int, dict]:
    out = tmp_path / name
    acc_launch(tmp_path, ["--backend", backend, "--nproc", "2", *flags], WORKER, ["--out", str(out), "--sizes", *sizes])
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
        assert seen["cp_block"] == [list(map(float, range(6))), list(map(float, range(6, 12)))]  # no cp: whole


@pytest.mark.slow
def test_the_launch_flags_give_the_workers_accelerator_its_parallelism_config(tmp_path):
    ranks = launch(tmp_path, "ddp", "flags", flags=("--parallelism_config_dp_replicate_size", "2"))  # Accelerate's
    assert [ranks[r]["names"] for r in (0, 1)] == [["dp_replicate"]] * 2 and ranks[1]["dp_sum"] == 3.0


def test_the_launch_refuses_sizes_before_any_process_starts(tmp_path):
    from tests.conftest import ACC, WORKERS, run

    proc = run([ACC, "launch", "--backend", "fsdp", "--nproc", "2", "--parallelism-config-dp-shard-size", "4",
                str(WORKERS / WORKER), "--out", str(tmp_path / "never")], tmp_path)
    assert proc.returncode == 2 and not (tmp_path / "never").exists()
    assert ("dp_shard_size 4 x tp_size 1 x cp_size 1 x sp_size 1 = 4 processes, but this run has 2: launch 4 "
            "processes") in proc.stderr
    drawn = run([ACC, "launch", "--dry-run", "--backend", "fsdp", "--nproc", "2",
                 "--parallelism-config-dp-shard-size", "2", str(WORKERS / WORKER)], tmp_path)
    assert drawn.returncode == 0, drawn.stderr
    assert "mesh        dp_shard 2 (outermost first)" in drawn.stdout and "dp_shard groups: [0, 1]" in drawn.stdout


@pytest.mark.slow
def test_a_dimension_the_backend_does_not_drive_is_refused_naming_one_that_does(tmp_path):
    ranks = launch(tmp_path, "ddp", "refused", "tp=2")
    assert ranks[0]["error"] == ("ParallelismConfig(tp_size=2): the ddp backend drives dp_replicate; backends that "
                                 "drive tp: fsdp (acc launch --backend fsdp)")


@pytest.mark.slow
@pytest.mark.parametrize("given,extra,backend", [("tp=2", (), "fsdp"), ("dp_shard=2", ("--fsdp-plugin",), "fsdp"),
                                                ("dp_shard=2", ("--deepspeed-plugin",), "deepspeed")],
                         ids=["tp", "fsdp-plugin", "deepspeed-plugin"])
def test_a_detected_backend_gives_way_to_the_one_the_scripts_code_asks_for_as_accelerate_does(tmp_path, given, extra,
                                                                                            backend):
    # Accelerate trains with FSDP when its plugin is given, and tensor parallel when the config says so, whatever
    # `accelerate launch --num_processes 2` said; acc's launch detects ddp, and the workers switch to fsdp
    out = tmp_path / "out"
    proc = acc_launch(tmp_path, ["--nproc", "2", "--output-dir", str(tmp_path / "runs")], WORKER,
                      ["--out", str(out), "--sizes", given, *extra])
    ranks = read_rank_results(out)
    assert "with the ddp backend (detected" in proc.stderr
    assert proc.stderr.count(f"selects the {backend} backend, as Accelerate trains it (the launch had detected ddp") == 1
    assert [ranks[r]["backend"] for r in (0, 1)] == [backend, backend]
    assert ranks[0]["distributed_type"].endswith(backend.upper()) and ranks[1]["dp_sum"] == (3.0 if "dp" in given else None)
    # the run's manifest records the backend that trained, and the switch
    (manifest,) = (tmp_path / "runs").glob("*/manifest.json")
    recorded = json.loads(manifest.read_text())
    assert recorded["backend"] == backend and backend in recorded["plugins"] and "ddp" not in recorded["plugins"]
    assert recorded["backend_switch"]["launch"] == "ddp" and recorded["backend_switch"]["code"].startswith("Accelerator(")


@pytest.mark.slow
def test_a_plugin_in_code_overrides_an_explicit_backend_with_a_warning(tmp_path):
    out = tmp_path / "out"
    proc = acc_launch(tmp_path, ["--backend", "ddp", "--nproc", "2"], WORKER,
                      ["--out", str(out), "--sizes", "dp_shard=2", "--fsdp-plugin"])
    assert read_rank_results(out)[0]["backend"] == "fsdp"
    assert "selects the fsdp backend over backend='ddp' from flag --backend" in proc.stderr


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


def test_the_mesh_is_drawn_rank_by_coordinate_with_the_groups_of_each_dim():
    from acc.runtime.parallelism import mesh_lines

    lines = mesh_lines({"dp_replicate": 1, "dp_shard": 2, "tp": 2, "cp": 1, "sp": 1})
    assert lines[:4] == ["dp_shard 2 x tp 2 (outermost first)",
                         "rank (dp_shard, tp): 0 (0, 0); 1 (0, 1); 2 (1, 0); 3 (1, 1)",
                         "dp_shard groups: [0, 2] [1, 3]", "tp groups: [0, 1] [2, 3]"]
    import torch

    mesh = torch.arange(4).reshape(2, 2)  # torch's layout of init_device_mesh((2, 2)): the same coordinates
    assert mesh[1, 0].item() == 2 and mesh[:, 1].tolist() == [1, 3]


def test_maybe_context_parallel_without_cp_leaves_buffers_whole_and_says_so_once(fresh_pm, capsys):
    import torch

    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)
    ids = torch.arange(6).reshape(1, 6)
    for _ in range(2):  # one block per step, as Accelerate's nd_parallel.py makes it
        with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1], no_restore_buffers={ids}):
            assert ids.tolist() == [[0, 1, 2, 3, 4, 5]]
    assert capsys.readouterr().err.count("maybe_context_parallel has no effect") <= 1
