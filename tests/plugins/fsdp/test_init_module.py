"""Models built sharded (`accelerator.init_module()`) and the fsdp speed settings, with real processes on gloo.

One small model (tests/workers/built_sharded.py), built normally or under init_module, trained on ddp and fsdp;
pretrained safetensors loaded into the sharded model; fsdp_from_rank0; p2p and all_to_all collectives with
prefetching against FSDP2's own. Each launch runs once per module and is shared by the tests that read it.
"""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import ACC, ROOT, WORKERS, read_rank_results, run
from tests.plugins.ddp.test_ddp import acc_launch

pytestmark = pytest.mark.slow
DDP = ["--backend", "ddp", "--nproc", "2"]
FSDP = ["--backend", "fsdp", "--nproc", "2", "--fsdp-wrap", "transformer_layer=Block"]
NATIVE = ["--fsdp-reduce-scatter", "native", "--fsdp-all-gather", "native", "--fsdp-prefetch", "0",
          "--fsdp-prefetch-in-backward", "on", "--no-fsdp-keep-last-unsharded"]  # FSDP2's own ways
ALL_TO_ALL = ["--fsdp-reduce-scatter", "all_to_all", "--fsdp-all-gather", "native"]
TOL = 1e-5


def close(a: list[float], b: list[float], tol: float = TOL) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol * max(1.0, abs(y)) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory):
    """Weights unlike the seed-0 build's (seed 123), as a safetensors file."""
    sys.path.insert(0, str(WORKERS))
    from built_sharded import build

    torch.manual_seed(123)
    path = tmp_path_factory.mktemp("pretrained") / "model.safetensors"
    save_file({k: v.contiguous() for k, v in build().state_dict().items()}, str(path))
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory, pretrained):
    """name -> {rank: results}, each launch made the first time a test asks for it."""
    tmp = tmp_path_factory.mktemp("runs")
    plans = {
        "ddp": (DDP, []),
        "ddp_init": (DDP, ["--build", "init_module"]),
        "ddp_load": (DDP, ["--build", "empty_init", "--load", str(pretrained)]),
        "fsdp": (FSDP, ["--grads", "--gathers"]),  # the defaults: p2p collectives on gloo, prefetch 1 in forward only,
        # last unit kept
        "fsdp_prefetch_in_backward": ([*FSDP, "--fsdp-prefetch-in-backward", "on"], ["--grads", "--gathers"]),
        "fsdp_native": ([*FSDP, *NATIVE], ["--grads"]),
        "fsdp3": ([*FSDP, "--nproc", "3"], ["--grads"]),
        "fsdp3_all_to_all": ([*FSDP, "--nproc", "3", *ALL_TO_ALL], ["--grads"]),
        "fsdp_init": (FSDP, ["--build", "init_module"]),
        "fsdp_load": (FSDP, ["--build", "empty_init", "--load", str(pretrained), "--weights", str(tmp / "w.safetensors")]),
        "fsdp_rank0": ([*FSDP, "--fsdp-from-rank0"], ["--build", "rank0"]),
    }
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            launch, args = plans[name]
            acc_launch(tmp, launch, "built_sharded.py", ["--out", str(tmp / name), *args])
            done[name] = read_rank_results(tmp / name)
            done[name]["dir"] = tmp
        return done[name]

    return get


def test_a_model_built_under_init_module_trains_like_the_normal_build(runs):
    ddp, fsdp = runs("ddp"), runs("fsdp")
    assert close(fsdp[0]["losses"], ddp[0]["losses"])  # the same script without init_module still works
    for sharded, normal in ((runs("fsdp_init"), fsdp), (runs("ddp_init"), ddp)):
        for rank in (0, 1):
            assert close(sharded[rank]["losses"], normal[rank]["losses"]), (sharded[rank], normal[rank])
            assert sharded[rank]["stream"] == normal[rank]["stream"]  # the random stream continues as after a build
    init = runs("fsdp_init")
    total = init[0]["total_params"]
    assert init[0]["local_params"] + init[1]["local_params"] == total
    assert abs(init[0]["local_params"] / total - 0.5) < 0.05
    assert runs("ddp_init")[0]["local_params"] == total


def test_pretrained_safetensors_load_each_ranks_part_into_the_sharded_model(runs, pretrained):
    loaded, ddp = runs("fsdp_load"), runs("ddp_load")
    weights = load_file(str(loaded["dir"] / "w.safetensors"))  # after prepare, gathered: the pretrained weights
    want = load_file(str(pretrained))
    assert sorted(weights) == sorted(want) and all(torch.equal(weights[k], want[k]) for k in want)
    assert close(loaded[0]["losses"], ddp[0]["losses"])
    file_bytes = sum(t.numel() * t.element_size() for t in want.values())
    assert ddp[0]["bytes_read"] == file_bytes  # a normal build reads every tensor whole
    assert loaded[0]["bytes_read"] + loaded[1]["bytes_read"] == file_bytes  # each rank its part, never a full copy
    assert max(loaded[r]["bytes_read"] for r in (0, 1)) <= 0.55 * file_bytes


def test_fsdp_from_rank0_takes_rank0s_weights(runs):
    rank0, fsdp = runs("fsdp_rank0"), runs("fsdp")
    assert rank0[1]["stream"] != rank0[0]["stream"]  # rank 1 built on the meta device (no initialisation drawn)
    assert close(rank0[0]["losses"], fsdp[0]["losses"])


def test_p2p_collectives_and_prefetching_give_fsdp2s_own_gradients(runs):
    tuned, native = runs("fsdp"), runs("fsdp_native")
    assert len(tuned[0]["grads"]) == tuned[0]["total_params"]
    assert close(tuned[0]["grads"], native[0]["grads"])
    assert close(tuned[0]["losses"], native[0]["losses"])


def test_on_gloo_backward_gathers_each_unit_when_its_backward_starts(runs):
    # the defaults on gloo: block 0 is gathered after block 1's backward has run, when its own starts; with
    # fsdp_prefetch_in_backward on, while block 1's runs. Block 1, the last unit, stays gathered from forward; the
    # root's own layers are gathered first. The same gradients either way
    default, prefetched = runs("fsdp"), runs("fsdp_prefetch_in_backward")
    for rank in (0, 1):
        assert default[rank]["backward_events"] == ["gather", "block 1", "gather", "block 0"], default[rank]
        assert prefetched[rank]["backward_events"] == ["gather", "gather", "block 1", "block 0"], prefetched[rank]
        assert prefetched[rank]["grads"] == default[rank]["grads"]
        assert prefetched[rank]["losses"] == default[rank]["losses"]


def test_p2p_reduce_scatter_sums_in_rank_order_like_all_to_all_on_three_processes(runs):
    # both sum the three chunks in rank order, and both all-gathers copy exactly: bitwise the same training
    p2p, all_to_all = runs("fsdp3"), runs("fsdp3_all_to_all")
    for rank in (0, 1, 2):
        assert p2p[rank]["grads"] == all_to_all[rank]["grads"]
        assert p2p[rank]["losses"] == all_to_all[rank]["losses"]


@pytest.mark.parametrize("flags,message", [
    (["--fsdp-reduce-scatter", "ring"],
     "flag --fsdp-reduce-scatter: expected one of: auto, native, all_to_all, p2p"),
    (["--fsdp-all-gather", "ring"], "flag --fsdp-all-gather: expected one of: auto, native, p2p"),
    (["--fsdp-prefetch", "9"], "flag --fsdp-prefetch: expected an integer from 0 to 8, got '9'"),
    (["--fsdp-prefetch", "-1"], "flag --fsdp-prefetch"),
    (["--fsdp-prefetch-in-backward", "sometimes"], "flag --fsdp-prefetch-in-backward: expected one of: auto, on, off"),
])
def test_fsdp_speed_settings_are_validated(tmp_path, flags, message):
    proc = run([ACC, "launch", *FSDP, *flags, "--dry-run", str(ROOT / "examples" / "quickstart.py")], tmp_path)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr


def test_fsdp_speed_settings_are_listed_with_their_defaults(tmp_path):
    proc = run([ACC, "launch", *FSDP, "--fsdp-prefetch", "2", "--dry-run", str(ROOT / "examples" / "quickstart.py")],
               tmp_path)
    assert proc.returncode == 0, proc.stderr
    rows = {ln.split()[0]: ln.split()[1:] for ln in proc.stdout.splitlines() if ln.startswith("  fsdp_")}
    assert rows["fsdp_reduce_scatter"][:2] == ["auto", "default"]
    assert rows["fsdp_all_gather"][:2] == ["auto", "default"]
    assert rows["fsdp_prefetch"][:2] == ["2", "flag"]
    assert rows["fsdp_prefetch_in_backward"][:2] == ["auto", "default"]
    assert rows["fsdp_keep_last_unsharded"][:2] == ["True", "default"]
    assert rows["fsdp_from_rank0"][:2] == ["False", "default"]


@pytest.mark.parametrize("nproc", [2, 3])
def test_p2p_reduce_scatter_equals_gloos_and_frees_fsdps_input(tmp_path, nproc):
    # bitwise the rank-order sum (2 processes: the peer's chunk received into the output, then one addition; 3: all
    # chunks stacked and summed), in place too, and within rounding of gloo's; fsdp's reduce-scatter (AVG) releases
    # its input once done (FSDP2 keeps a reference to it until the next unit's), but not a view into a larger buffer
    acc_launch(tmp_path, ["--backend", "ddp", "--nproc", str(nproc)], "reduce_scatter.py", ["--out", str(tmp_path)])
    results = read_rank_results(tmp_path)
    assert sorted(results) == list(range(nproc))
    for rank, res in results.items():
        assert res == {"apart_equal": True, "in_place_equal": True, "gloo_close": True, "fsdp_avg_equal": True,
                       "fsdp_input_bytes": 0, "view_avg_equal": True, "flat_kept": True}, \
            (rank, res)
