"""What transformers' Trainer relies on in acc: `AcceleratorState().fsdp_plugin` and the `save_fsdp_*`/`load_fsdp_*`
functions on a model acc prepared with FSDP2 (fsdp backend), a DeepSpeedPlugin's HfDeepSpeedConfig completed after
the Accelerator is built (deepspeed backend), both with real processes on gloo (tests/workers/hf_trainer_hooks.py);
`accelerator.backward(loss, scale_wrt_gas=False)` in process."""

from __future__ import annotations

import copy
import os
import warnings

import pytest
import torch

from tests.conftest import read_rank_results
from tests.plugins.ddp.test_ddp import acc_launch

FSDP = ["--backend", "fsdp", "--nproc", "2"]
DS = ["--backend", "deepspeed", "--nproc", "2"]
WORKER = "hf_trainer_hooks.py"


def launch(tmp, backend_args: list[str], name: str, *script_args: str) -> dict[int, dict]:
    out = tmp / name
    acc_launch(tmp, backend_args, WORKER, ["--out", str(out), *script_args])
    results = read_rank_results(out)
    assert sorted(results) == [0, 1], results
    return results


# ------------------------------------------------------------------------------ fsdp: two launches


@pytest.fixture(scope="module")
def fsdp_runs(tmp_path_factory):
    """By the plugin's state_dict_type: "full", an Accelerator given FullyShardedDataParallelPlugin(
    state_dict_type="FULL_STATE_DICT"); "sharded", an Accelerator given none (acc's default: SHARDED_STATE_DICT).
    Each saves and loads with AcceleratorState().fsdp_plugin, as the Trainer does."""
    tmp = tmp_path_factory.mktemp("fsdp")
    return {"full": (tmp / "full", launch(tmp, FSDP, "full", "--check", "fsdp", "--plugin", "full")),
            "sharded": (tmp / "sharded", launch(tmp, FSDP, "sharded", "--check", "fsdp", "--plugin", "none"))}


@pytest.mark.slow
def test_accelerator_state_shows_the_fsdp_plugin_given(fsdp_runs):
    _, res = fsdp_runs["full"]
    for rank in (0, 1):
        r = res[rank]
        assert r["distributed_type"] == "DistributedType.FSDP" and r["world"] == 2
        assert r["plugin_is_given"] and r["plugin_stable"]
        assert r["fsdp_version"] == 2 and r["state_dict_type"] == "FULL_STATE_DICT"
        # expected: FULL_STATE_DICT applies to save_fsdp_* only (acc's save_state writes shards), which acc says
        assert any(w.startswith("UserWarning") and "FULL_STATE_DICT" in w for w in r["init_warnings"]), r


@pytest.mark.slow
def test_without_a_plugin_accelerator_state_shows_fsdp2_defaults(fsdp_runs):
    _, res = fsdp_runs["sharded"]
    for rank in (0, 1):
        r = res[rank]
        assert r["distributed_type"] == "DistributedType.FSDP" and not r["plugin_is_given"] and r["plugin_stable"]
        assert r["plugin_type"] == "FullyShardedDataParallelPlugin"
        assert r["fsdp_version"] == 2 and r["state_dict_type"] == "SHARDED_STATE_DICT"
        assert r["init_warnings"] == []


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["full", "sharded"])
def test_load_fsdp_model_and_optimizer_restore_what_was_saved(fsdp_runs, kind):
    _, res = fsdp_runs[kind]
    main = res[0]
    assert main["param_types"] == ["DTensor"] == main["param_types_after_load"]  # FSDP2's sharded parameters
    assert sorted(main["saved_weights"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    # the perturbation and the extra step changed the weights and every rank's optimizer state...
    assert main["perturbed_weights"] != main["saved_weights"]
    for rank in (0, 1):
        r = res[rank]
        assert r["saved_opt"] and r["perturbed_opt"] != r["saved_opt"]
        # ...and the load brings back exactly what was saved: this rank's shard of exp_avg, exp_avg_sq, step
        assert r["loaded_opt"] == r["saved_opt"], rank
    assert main["loaded_weights"] == main["saved_weights"]  # full weights, from get_state_dict (main process)
    # the step taken after the save, taken again from what was loaded, gives the same loss and weights
    assert main["reloaded_loss"] == main["continued_loss"] == res[1]["reloaded_loss"]
    assert main["reloaded_weights"] == main["continued_weights"]


@pytest.mark.slow
def test_full_state_dict_writes_one_file_each_from_the_main_process(fsdp_runs):
    out, res = fsdp_runs["full"]
    ckpt = out / "ckpt"
    assert res[0]["written"] == res[1]["written"] == ["pytorch_model_fsdp.bin", "optimizer.bin"]
    assert sorted(os.listdir(ckpt)) == ["optimizer.bin", "pytorch_model_fsdp.bin"]
    # saved into a directory of each rank's own: only rank 0 writes
    assert res[0]["own_listing"] == ["optimizer.bin", "pytorch_model_fsdp.bin"] and res[1]["own_listing"] == []
    weights = torch.load(ckpt / "pytorch_model_fsdp.bin", weights_only=True)
    assert {k: v.flatten().tolist() for k, v in weights.items()} == res[0]["saved_weights"]
    optim = torch.load(ckpt / "optimizer.bin", weights_only=True)
    assert sorted(optim["state"]) == ["0.bias", "0.weight", "2.bias", "2.weight"]  # keyed by parameter name
    for name, state in optim["state"].items():
        for key in ("exp_avg", "exp_avg_sq"):  # the full tensor: rank 0's rows, then rank 1's
            assert state[key].flatten().tolist() == res[0]["saved_opt"][f"{name}.{key}"] + \
                res[1]["saved_opt"][f"{name}.{key}"], (name, key)


@pytest.mark.slow
def test_sharded_state_dict_writes_directories_every_process_writes_to(fsdp_runs):
    out, res = fsdp_runs["sharded"]
    assert res[0]["written"] == res[1]["written"] == ["pytorch_model_fsdp_0", "optimizer_0"]
    for name in ("pytorch_model_fsdp_0", "optimizer_0"):
        assert sorted(os.listdir(out / "ckpt" / name)) == [".metadata", "__0_0.distcp", "__1_0.distcp"], name


def test_accelerator_state_has_no_fsdp_plugin_on_the_cpu_backend(fresh_pm):
    from acc import Accelerator
    from acc.state import AcceleratorState
    from acc.utils import FullyShardedDataParallelPlugin

    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)
    assert accelerator.backend == "cpu" and accelerator.num_processes == 1
    assert AcceleratorState().fsdp_plugin is None and accelerator.state.fsdp_plugin is None
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.warns(UserWarning, match=r"Accelerator\(FullyShardedDataParallelPlugin\(\.\.\.\)\) is ignored: "
                                         "this run uses the cpu backend"):
        Accelerator(plugin_manager=fresh_pm, cpu=True, fsdp_plugin=FullyShardedDataParallelPlugin())
    assert AcceleratorState().fsdp_plugin is None  # given, but not the fsdp backend's run: None, as in Accelerate
    AcceleratorState._reset_state(reset_partial_state=True)


# ------------------------------------------------------------------------------ deepspeed: one launch


@pytest.fixture(scope="module")
def ds_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ds")
    return launch(tmp, DS, "ds", "--check", "deepspeed")


@pytest.mark.slow
def test_the_deepspeed_plugins_hf_ds_config_is_the_object_given(ds_run):
    for rank in (0, 1):
        assert ds_run[rank]["hf_ds_config_is_cfg"] and ds_run[rank]["hf_ds_config_is_cfg_after"]


@pytest.mark.slow
def test_the_hf_ds_config_completed_after_the_accelerator_is_read_again_at_prepare(ds_run):
    for rank in (0, 1):
        r = ds_run[rank]
        assert r["clipping_before"] is None  # not in the config the Accelerator was built with
        assert r["config_after"]["gradient_clipping"] == 0.5
        assert r["engine_clipping"] == 0.5  # the engine clips with it


@pytest.mark.slow
def test_the_deepspeed_configs_accumulation_steps_win_over_the_accelerators_one(ds_run):
    for rank in (0, 1):
        r = ds_run[rank]
        assert r["accelerator_gas"] == 2 and r["engine_gas"] == 2
        assert r["config_after"]["gradient_accumulation_steps"] == 2
        assert r["config_after"]["train_micro_batch_size_per_gpu"] == 4 and r["config_after"]["train_batch_size"] == 16
        assert any(w.startswith("UserWarning") and "using the DeepSpeed config's" in w for w in r["prepare_warnings"])
        assert r["micro_batches"] == 4 and r["engine_steps"] == 2  # 4 micro-batches, one optimizer step per 2


# ------------------------------------------------------------------------------ in process: backward


@pytest.mark.parametrize("scale_wrt_gas,divisor", [(True, 2.0), (False, 1.0)])
def test_backward_divides_by_the_accumulation_steps_unless_scale_wrt_gas_is_false(fresh_pm, scale_wrt_gas, divisor):
    from acc import Accelerator
    from acc.state import AcceleratorState

    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True, gradient_accumulation_steps=2)
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    plain = copy.deepcopy(net)
    prepared = accelerator.prepare(net)
    x = torch.randn(5, 3)
    kwargs = {} if scale_wrt_gas else {"scale_wrt_gas": False}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # scale_wrt_gas is taken, not passed on to torch's backward
        accelerator.backward(prepared(x).pow(2).sum(), **kwargs)
    plain(x).pow(2).sum().backward()
    for ours, reference in ((net.weight, plain.weight), (net.bias, plain.bias)):
        assert torch.equal(ours.grad, reference.grad / divisor)  # dividing by 2 is exact in floating point
    AcceleratorState._reset_state(reset_partial_state=True)
