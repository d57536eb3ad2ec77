"""DistributedDataParallelKwargs(comm_hook=...) and acc.local_sgd.LocalSGD on 2 real gloo processes."""

from __future__ import annotations

import pytest
import torch

from tests.conftest import ACC, WORKERS, read_rank_results, run

pytestmark = pytest.mark.slow

DDP2 = ["--backend", "ddp", "--nproc", "2"]


def launch(tmp_path, script: str, *args: str) -> dict[int, dict]:
    tmp_path.mkdir(parents=True, exist_ok=True)
    out = tmp_path / "out"
    proc = run([ACC, "launch", *DDP2, str(WORKERS / script), "--out", str(out), *args], tmp_path, timeout=180)
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    results = read_rank_results(out)
    assert sorted(results) == [0, 1] and results[0].get("world", 2) == 2
    return results


def test_fp16_compression_hook_averages_float16_gradients(tmp_path):
    plain = launch(tmp_path / "no", "ddp_comm_hook.py", "--mode", "no")
    exact = [sum(row) / 2 for row in zip(*[r["exact"][0] for r in plain.values()])]  # sanity of the worker
    assert plain[0]["grads"] == plain[1]["grads"] and plain[0]["exact"][0] == exact
    assert torch.allclose(torch.tensor(plain[0]["grads"]), torch.tensor(plain[0]["exact"]), rtol=1e-6, atol=1e-6)

    fp16 = launch(tmp_path / "fp16", "ddp_comm_hook.py", "--mode", "fp16")
    # float32 mean: (1 + 2**-12 + 1) / 2 = 1 + 2**-13; through float16 (spacing 2**-10 at 1) it is exactly 1
    assert fp16[0]["grad"] == fp16[1]["grad"] == 1.0


@pytest.mark.parametrize("mode", ["power_sgd", "power_sgd_fp16"])
def test_power_sgd_hook_compresses_after_its_start_iteration(tmp_path, mode):
    res = launch(tmp_path, "ddp_comm_hook.py", "--mode", mode)
    grads, exact = torch.tensor(res[0]["grads"]), torch.tensor(res[0]["exact"])
    assert res[0]["grads"] == res[1]["grads"]  # every replica got the same (all-reduced) gradient
    errors = ((grads - exact).norm(dim=1) / exact.norm(dim=1)).tolist()
    if mode == "power_sgd":
        assert errors[0] < 1e-5 and errors[1] < 1e-5  # plain all-reduce before start_powerSGD_iter
    assert errors[2] > 0.05 and errors[3] > 0.05  # then a rank-1 approximation of the 8x8 mean
    assert all(e < 1.5 for e in errors)


def test_local_sgd_replicas_differ_between_sync_points_and_agree_after(tmp_path):
    res = launch(tmp_path, "local_sgd.py", "--every", "3", "--steps", "7")
    assert res[0]["enabled"] and res[0]["num_steps"] == 7
    for step in range(7):
        r0, r1 = res[0]["steps"][step], res[1]["steps"][step]
        assert r0["before"] != r1["before"], f"step {step + 1}: gradients were synchronised (no no_sync?)"
        if (step + 1) % 3 == 0:  # a sync point: both replicas become the mean of the two
            mean = (torch.tensor(r0["before"]) + torch.tensor(r1["before"])) / 2
            assert torch.allclose(torch.tensor(r0["after"]), mean, atol=1e-6)
            assert r0["after"] == r1["after"]
        else:
            assert r0["after"] == r0["before"] and r1["after"] == r1["before"]
    last0, last1 = res[0]["steps"][-1]["after"], res[1]["steps"][-1]["after"]
    assert last0 != last1 and res[0]["final"] == res[1]["final"]  # leaving the block averages once more
    assert torch.allclose(torch.tensor(res[0]["final"]), (torch.tensor(last0) + torch.tensor(last1)) / 2, atol=1e-6)


def test_disabled_local_sgd_leaves_ddp_synchronising_every_step(tmp_path):
    res = launch(tmp_path, "local_sgd.py", "--every", "3", "--steps", "4", "--disabled")
    assert res[0]["enabled"] is False and res[0]["num_steps"] == 4
    assert all(a["after"] == b["after"] for a, b in zip(res[0]["steps"], res[1]["steps"]))
