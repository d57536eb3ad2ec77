"""The ddp backend with real processes on gloo: equivalence, data sharding, collectives, launch paths."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest
import torch

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results, run

pytestmark = pytest.mark.slow


def acc_launch(tmp_path, launch_args: list[str], script: str, script_args: list[str], timeout: float = 180,
               env: dict | None = None) -> subprocess.CompletedProcess:
    proc = run([ACC, "launch", *launch_args, str(WORKERS / script), *script_args], tmp_path, timeout=timeout, env=env)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


DDP2 = ["--backend", "ddp", "--nproc", "2"]
# acc's own semantics (seeded shuffling, one scheduler step per optimizer step, exact resume): what the tests of
# "N processes x batch B equal 1 process x batch N*B" and of exact resume rely on
ACC_SEMANTICS = ["--semantics", "acc"]


def test_two_processes_with_batch_b_equal_one_process_with_batch_2b(tmp_path):
    acc_launch(tmp_path, [*DDP2, *ACC_SEMANTICS], "train_mlp.py", ["--out", str(tmp_path / "ddp"), "--batch", "8",
                                                                   "--shuffle", "--epochs", "2"])
    acc_launch(tmp_path, ACC_SEMANTICS, "train_mlp.py", ["--out", str(tmp_path / "one"), "--batch", "16", "--shuffle",
                                                         "--epochs", "2"])
    ddp, one = read_rank_results(tmp_path / "ddp"), read_rank_results(tmp_path / "one")
    assert ddp[0]["world"] == 2 and ddp[0]["backend"] == "ddp" and one[0]["world"] == 1
    assert torch.allclose(torch.tensor(ddp[0]["weights"]), torch.tensor(one[0]["weights"]), rtol=1e-5, atol=1e-7)
    assert ddp[0]["weights"] == ddp[1]["weights"]  # replicas agree
    # the global batches are the same samples: rank 0's and rank 1's batches of a step form the 2B batch
    for step, big in enumerate(one[0]["seen"]):
        assert sorted(ddp[0]["seen"][step] + ddp[1]["seen"][step]) == sorted(big)


@pytest.mark.parametrize("samples,world", [(82, 2), (82, 3), (96, 2)])
def test_gather_for_metrics_sees_each_sample_once_in_order(tmp_path, samples, world):
    acc_launch(tmp_path, ["--backend", "ddp", "--nproc", str(world)], "eval_gather.py",
               ["--out", str(tmp_path), "--samples", str(samples), "--batch", "16"])
    results = read_rank_results(tmp_path)
    assert sorted(results) == list(range(world))
    for rank, res in results.items():
        assert res["gathered"][0] == list(range(samples)), f"rank {rank}"
        assert res["objects"][0] == [f"id{i}" for i in range(samples)]
    assert len({res["steps"] for res in results.values()}) == 1  # every rank takes the same number of steps


def test_iterable_dataset_is_sharded(tmp_path):
    acc_launch(tmp_path, DDP2, "eval_gather.py", ["--out", str(tmp_path), "--samples", "82", "--batch", "16",
                                                  "--iterable"])
    results = read_rank_results(tmp_path)
    assert results[0]["gathered"][0] == list(range(82))
    assert not set(results[0]["mine"][0]) & set(results[1]["mine"][0]) - set(range(16))  # only padding overlaps


def test_shuffled_epochs_cover_the_dataset_and_change_order(tmp_path):
    acc_launch(tmp_path, DDP2, "eval_gather.py", ["--out", str(tmp_path), "--samples", "82", "--batch", "16",
                                                  "--shuffle", "--epochs", "2"])
    results = read_rank_results(tmp_path)
    for epoch in range(2):
        union = results[0]["mine"][epoch] + results[1]["mine"][epoch]
        assert sorted(set(union)) == list(range(82))
        # 82 = 5 batches of 16 + a short one of 2: as in Accelerate, the short batch is filled up to 16 with
        # samples from the start of the epoch (96 dealt), and gather_for_metrics drops those 14 again
        assert len(union) == 96
        assert sorted(results[0]["gathered"][epoch]) == list(range(82))
    assert results[0]["gathered"][0] != results[0]["gathered"][1]
    assert results[0]["gathered"] == results[1]["gathered"]


def test_generators_seeded_differently_agree_at_each_epoch(tmp_path):
    """Each rank's DataLoader generator starts from its own seed; rank 0's state reaches every rank at each pass's
    start (one tensor broadcast), so the ranks deal one permutation between them and cover the dataset."""
    acc_launch(tmp_path, DDP2, "eval_gather.py", ["--out", str(tmp_path), "--samples", "64", "--batch", "8",
                                                  "--shuffle", "--epochs", "2", "--rank-seeded-generator"])
    results = read_rank_results(tmp_path)
    for epoch in range(2):
        assert sorted(results[0]["mine"][epoch] + results[1]["mine"][epoch]) == list(range(64))
    assert results[0]["mine"][0] != results[0]["mine"][1]


def test_debug_mode_checks_shapes_across_processes_before_a_collective(tmp_path):
    acc_launch(tmp_path, ["--backend", "ddp", "--nproc", "2"], "debug_checks.py", ["--out", str(tmp_path)])
    for r, res in read_rank_results(tmp_path).items():
        assert res["debug_default"] is False and res["debug"] is True
        assert res["padded_without_debug"] == [2, 2]
        for op in ("reduce", "broadcast"):
            assert f"Operation: `{op}`" in res[op] and "Process 0: " in res[op] and "Process 1: " in res[op]
        assert "{'t': [1, 2]}" in res["reduce"] and "{'t': [2, 2]}" in res["reduce"]
        assert res["pad_rows"] == ""  # one number of dimensions: padded, not refused
        assert "numbers of dimensions" in res["pad_dims"] and "Process 1: 3" in res["pad_dims"]
        assert res["reduce_same"] == [0.5]
        assert res["copied"] == [7, 8, 9]


def test_collectives(tmp_path):
    acc_launch(tmp_path, ["--backend", "ddp", "--nproc", "3"], "collectives.py", ["--out", str(tmp_path)])
    results = read_rank_results(tmp_path)
    rows = [[float(r), float(r)] for r in range(3) for _ in range(r + 1)]
    for r, res in results.items():
        assert res["gather_uneven"] == rows
        assert res["gather_nested"] == {"a": [0, 1, 2], "b": [[0, 0], [1, 1], [2, 2]]}
        assert res["gather_scalar"] == [0.0, 1.0, 2.0] and res["gather_bool"] == [True, False, True]
        assert res["reduce"] == {"sum": [6.0, 30.0], "mean": [2.0, 10.0], "max": [3.0, 20.0], "min": [1.0, 0.0]}
        # synchronize_rng_states gave every rank rank 0's states (seeds 100 and 200)
        assert res["synced_draws"] == [torch.rand(3, generator=torch.Generator().manual_seed(100)).tolist(),
                                       torch.rand(3, generator=torch.Generator().manual_seed(200)).tolist()]
        assert res["reduce_int_mean"] == [2.0]
        assert res["broadcast"] == [2.0, 2.0, 2.0] and res["broadcast_object"] == {"from": 0}
        assert res["gather_object"] == [{"rank": 0}, {"rank": 1}, {"rank": 2}]
        assert res["padded"] == [1] * (r + 1) + [-1] * (2 - r)
        assert res["padded_first"] == [0.0] * (2 - r) + [1.0] * (r + 1)
    assert [results[r]["split"] for r in range(3)] == [[0, 1, 2], [3, 4], [5, 6]]
    assert [results[r]["split_padded"] for r in range(3)] == [[0, 1, 2], [3, 4, 6], [5, 6, 6]]
    assert results[0]["first_time"] < min(results[1]["first_time"], results[2]["first_time"])


def test_two_runs_started_together_do_not_clash(tmp_path):
    args = ["--out", None, "--batch", "8"]
    procs = []
    for name in ("a", "b"):
        args[1] = str(tmp_path / name)
        procs.append(subprocess.Popen([ACC, "launch", *DDP2, str(WORKERS / "train_mlp.py"), *args], cwd=tmp_path,
                                      env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    assert read_rank_results(tmp_path / "a")[0]["weights"] == read_rank_results(tmp_path / "b")[0]["weights"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("nproc", [1, 2])
def test_two_machines_on_one_host_form_one_world(tmp_path, nproc):
    port = str(free_port())
    common = ["--backend", "ddp", "--nproc", str(nproc), "--num-machines", "2", "--main-process-ip", "127.0.0.1",
              "--main-process-port", port]
    procs = [
        subprocess.Popen([ACC, "launch", *common, "--machine-rank", str(rank), str(WORKERS / "train_mlp.py"),
                          "--out", str(tmp_path / "out"), "--batch", "4"], cwd=tmp_path, env=clean_env(tmp_path),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for rank in (0, 1)
    ]
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
    results = read_rank_results(tmp_path / "out")
    assert sorted(results) == list(range(2 * nproc))
    assert all(r["world"] == 2 * nproc for r in results.values())
    assert len({tuple(r["weights"]) for r in results.values()}) == 1


def test_plain_torchrun_with_backend_from_environment(tmp_path):
    proc = run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                str(WORKERS / "train_mlp.py"), "--out", str(tmp_path), "--batch", "8"], tmp_path,
               env=clean_env(tmp_path, ACC_BACKEND="ddp"), timeout=180)
    assert proc.returncode == 0, proc.stderr
    results = read_rank_results(tmp_path)
    assert results[0]["world"] == 2 and results[1]["backend"] == "ddp"


def test_plain_python_with_ddp_backend_says_how_to_launch(tmp_path):
    proc = run([sys.executable, str(WORKERS / "train_mlp.py"), "--out", str(tmp_path)], tmp_path,
               env=clean_env(tmp_path, ACC_BACKEND="ddp"))
    assert proc.returncode != 0
    assert "backend 'ddp' runs processes started by a launcher" in proc.stderr
    assert "acc launch --backend ddp --nproc N" in proc.stderr


def test_dry_run_shows_the_elastic_plan(tmp_path):
    proc = run([ACC, "launch", *DDP2, "--num-machines", "2", "--machine-rank", "1", "--main-process-ip", "10.1.2.3",
                "--max-restarts", "2", "--dry-run", str(WORKERS / "train_mlp.py")], tmp_path)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "engine      elastic: torch's elastic agent" in out
    assert "processes   2 per machine x 2 machine(s) = 4, this is machine 1" in out
    assert "rendezvous  static at 10.1.2.3:29500 (the default across machines" in out and "restarts    2" in out
    assert "rank 0      the main process: machine 0 (the static rendezvous gives machine k the global ranks " \
           "k*2..k*2+1, whatever the order the machines arrive in)" in out
    assert "joining     every machine joins within 900 s (--rdzv-timeout)" in out
    assert "process_group_backend        auto" in out


def test_process_group_backend_setting_is_validated(tmp_path):
    proc = run([ACC, "launch", *DDP2, "--process-group-backend", "nccl", "--cpu", "--dry-run",
                str(WORKERS / "train_mlp.py")], tmp_path)
    assert proc.returncode == 2 and "process_group_backend 'nccl' needs CUDA devices, but --cpu is set" in proc.stderr
