"""The `accelerate` names transformers imports, as acc keeps them: HfDeepSpeedConfig, DeepSpeedSchedulerWrapper, the
FSDP save/load helpers, the merge-weights parser, the config-file helpers, ParallelismConfig and GradientState's
`_set_sync_gradients`."""

from __future__ import annotations

import argparse
import base64
import copy
import json
import types

import pytest

import acc
from acc.compat.deepspeed_config import HfDeepSpeedConfig

ZERO3_CPU = {"train_batch_size": "auto",
             "zero_optimization": {"stage": 3, "offload_param": {"device": "cpu"}, "overlap_comm": True,
                                   "contiguous_gradients": False}}


# --- HfDeepSpeedConfig -----------------------------------------------------------------------------------------------

def test_hf_deepspeed_config_is_one_object_under_every_name():
    import acc.utils
    import acc.utils.deepspeed

    assert acc.utils.deepspeed.HfDeepSpeedConfig is HfDeepSpeedConfig
    assert acc.utils.HfDeepSpeedConfig is HfDeepSpeedConfig


def test_a_dict_config_is_copied_so_the_callers_dict_stays_as_given():
    given = copy.deepcopy(ZERO3_CPU)
    config = HfDeepSpeedConfig(given)
    config.config["zero_optimization"]["stage"] = 2
    config.config["train_batch_size"] = 8
    assert given == ZERO3_CPU


def test_a_json_file_json_text_and_base64_json_load_the_same_dict(tmp_path):
    path = tmp_path / "ds.json"
    text = json.dumps(ZERO3_CPU)
    path.write_text(text)
    encoded = base64.urlsafe_b64encode(text.encode("utf-8")).decode("ascii")
    loaded = [HfDeepSpeedConfig(source).config for source in (str(path), path, text, encoded)]
    assert loaded == [ZERO3_CPU] * 4


@pytest.mark.parametrize("bad", ["no/such/file.json", "{not json", "[1, 2]", 42])
def test_bad_input_raises_value_error_naming_what_was_given(bad):
    with pytest.raises(ValueError, match="expected a DeepSpeed config") as info:
        HfDeepSpeedConfig(bad)
    assert repr(bad) in str(info.value)


def test_get_value_reads_dotted_keys_with_defaults_for_missing_keys_and_parents():
    config = HfDeepSpeedConfig(ZERO3_CPU)
    assert config.get_value("zero_optimization.stage") == 3
    assert config.get_value("zero_optimization.offload_param.device") == "cpu"
    assert config.get_value("train_batch_size") == "auto"
    assert config.get_value("zero_optimization.reduce_bucket_size") is None
    assert config.get_value("zero_optimization.reduce_bucket_size", 5) == 5
    assert config.get_value("bf16.enabled", "missing parent") == "missing parent"
    assert config.get_value("zero_optimization.stage.a.b", 7) == 7  # a scalar two levels up reads as missing


def test_get_value_reads_a_scalar_direct_parent_as_missing_too():
    config = HfDeepSpeedConfig(ZERO3_CPU)
    assert config.get_value("zero_optimization.stage.deeper", 7) == 7


@pytest.mark.parametrize(("zero", "stage", "offload"), [
    ({"stage": 3, "offload_param": {"device": "cpu"}}, 3, True),
    ({"stage": 3, "offload_optimizer": {"device": "nvme"}}, 3, True),
    ({"stage": 2, "offload_optimizer": {"device": "cpu"}}, 2, True),
    ({"stage": 2, "offload_optimizer": {"device": "none"}}, 2, False),
    ({"stage": 3}, 3, False),
    ({"stage": 1, "offload_optimizer": {"device": "cpu"}}, 1, False),  # offload counts only for stage 2/3
    ({}, -1, False),
])
def test_zero_stage_and_offload(zero, stage, offload):
    config = HfDeepSpeedConfig({"zero_optimization": zero})
    assert (config.is_zero2(), config.is_zero3(), config.is_offload()) == (stage == 2, stage == 3, offload)


def test_is_true_and_is_false_are_false_for_unset_keys():
    config = HfDeepSpeedConfig(ZERO3_CPU)
    assert config.is_true("zero_optimization.overlap_comm") and not config.is_false("zero_optimization.overlap_comm")
    assert config.is_false("zero_optimization.contiguous_gradients")
    assert not config.is_true("zero_optimization.contiguous_gradients")
    assert not config.is_true("zero_optimization.round_robin_gradients")
    assert not config.is_false("zero_optimization.round_robin_gradients")
    assert not config.is_true("fp16.enabled") and not config.is_false("fp16.enabled")


def test_del_config_sub_tree_deletes_ignores_absent_keys_and_raises_when_told_it_must_exist():
    config = HfDeepSpeedConfig(ZERO3_CPU)
    config.del_config_sub_tree("zero_optimization.offload_param")
    assert "offload_param" not in config.config["zero_optimization"]
    assert config.get_value("zero_optimization.stage") == 3
    before = copy.deepcopy(config.config)
    config.del_config_sub_tree("zero_optimization.offload_param")
    config.del_config_sub_tree("fp16.enabled")
    assert config.config == before
    with pytest.raises(ValueError, match="no 'fp16.enabled' entry"):
        config.del_config_sub_tree("fp16.enabled", must_exist=True)
    with pytest.raises(ValueError, match="no 'zero_optimization.offload_param' entry"):
        config.del_config_sub_tree("zero_optimization.offload_param", must_exist=True)


# --- DeepSpeedSchedulerWrapper ---------------------------------------------------------------------------------------

def test_deepspeed_scheduler_wrapper_step_leaves_the_learning_rate_alone():
    import torch

    import acc.utils
    from acc.runtime.optim import DeepSpeedSchedulerWrapper
    from acc.scheduler import AcceleratedScheduler

    assert acc.utils.DeepSpeedSchedulerWrapper is DeepSpeedSchedulerWrapper
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    for optimizers in (optimizer, [optimizer]):
        wrapper = DeepSpeedSchedulerWrapper(scheduler, optimizers)
        assert isinstance(wrapper, AcceleratedScheduler)
        for _ in range(3):
            optimizer.step()
            wrapper.step()
        assert scheduler.get_last_lr() == [1.0] and optimizer.param_groups[0]["lr"] == 1.0
    scheduler.step()  # the wrapped scheduler itself still steps: the test above could see a change
    assert optimizer.param_groups[0]["lr"] == 0.5


# --- save/load_fsdp_model and save/load_fsdp_optimizer ---------------------------------------------------------------

def _trained(seed: int):
    import torch

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    model(torch.randn(5, 4)).pow(2).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def _tuples(group: dict) -> dict:
    # torch's set_optimizer_state_dict(full_state_dict=True) flattens and rebuilds the state dict, which turns
    # AdamW's betas tuple into a list (same values; torch's own behaviour, not the helpers')
    return {k: tuple(v) if isinstance(v, list) else v for k, v in group.items()}


def _assert_same_optimizer_state(got, want):
    import torch

    got, want = got.state_dict(), want.state_dict()
    assert [_tuples(g) for g in got["param_groups"]] == [_tuples(g) for g in want["param_groups"]]
    assert sorted(got["state"]) == sorted(want["state"]) and want["state"]
    for index, state in want["state"].items():
        assert sorted(got["state"][index]) == sorted(state)
        for key, value in state.items():
            assert torch.equal(torch.as_tensor(got["state"][index][key]), torch.as_tensor(value)), (index, key)


def test_fsdp_helpers_are_one_object_under_every_name():
    import acc.checkpointing.fsdp_files as files
    import acc.utils
    import acc.utils.fsdp_utils

    for name in ("save_fsdp_model", "load_fsdp_model", "save_fsdp_optimizer", "load_fsdp_optimizer"):
        assert getattr(acc.utils, name) is getattr(files, name) is getattr(acc.utils.fsdp_utils, name)


@pytest.mark.parametrize(("kind", "index", "model_name", "optimizer_name"), [
    ("FULL_STATE_DICT", 0, "pytorch_model_fsdp.bin", "optimizer.bin"),
    ("FULL_STATE_DICT", 1, "pytorch_model_fsdp_1.bin", "optimizer_1.bin"),
    ("SHARDED_STATE_DICT", 0, "pytorch_model_fsdp_0", "optimizer_0"),
])
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled, unavailable or uninitialized:UserWarning")
def test_fsdp_model_and_optimizer_round_trip_in_one_process(tmp_path, kind, index, model_name, optimizer_name):
    import torch

    from acc.checkpointing.fsdp_files import load_fsdp_model, load_fsdp_optimizer, save_fsdp_model, save_fsdp_optimizer

    plugin = types.SimpleNamespace(state_dict_type=kind)
    model, optimizer = _trained(0)
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    saved_optimizer = copy.deepcopy(optimizer)

    save_fsdp_model(plugin, None, model, tmp_path, model_index=index)
    save_fsdp_optimizer(plugin, None, optimizer, model, tmp_path, optimizer_index=index)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([model_name, optimizer_name])
    assert (tmp_path / model_name).is_file() == (tmp_path / optimizer_name).is_file() == kind.startswith("FULL")

    fresh, fresh_optimizer = _trained(1)
    fresh_optimizer.param_groups[0]["lr"] = 0.5
    assert not torch.equal(fresh[0].weight, weights["0.weight"])
    load_fsdp_model(plugin, None, fresh, tmp_path, model_index=index)
    load_fsdp_optimizer(plugin, None, fresh_optimizer, fresh, tmp_path, optimizer_index=index)
    assert sorted(fresh.state_dict()) == sorted(weights)
    for key, value in weights.items():
        assert torch.equal(fresh.state_dict()[key], value), key
    _assert_same_optimizer_state(fresh_optimizer, saved_optimizer)


# --- commands: merge-weights, config ---------------------------------------------------------------------------------

def test_merge_command_parser_parses_accelerates_merge_weights_arguments():
    from acc.commands.merge import merge_command, merge_command_parser

    args = merge_command_parser().parse_args(["CKPT", "OUT", "--unsafe_serialization", "--remove_checkpoint_dir"])
    assert (args.checkpoint_directory, args.output_path) == ("CKPT", "OUT")
    assert args.unsafe_serialization is True and args.remove_checkpoint_dir is True
    defaults = merge_command_parser().parse_args(["CKPT", "OUT"])
    assert defaults.unsafe_serialization is False and defaults.remove_checkpoint_dir is False

    top = argparse.ArgumentParser("accelerate")
    merge_command_parser(top.add_subparsers(dest="command"))
    sub = top.parse_args(["merge-weights", "CKPT", "OUT"])
    assert sub.command == "merge-weights" and sub.func is merge_command and sub.checkpoint_directory == "CKPT"


def test_commands_config_exposes_the_config_file_helpers():
    import acc.commands.config
    import acc.commands.config.config_args as config_args

    assert acc.commands.config.default_config_file is config_args.default_config_file
    assert acc.commands.config.load_config_from_file is config_args.load_config_from_file
    assert callable(acc.commands.config.load_config_from_file)


# --- ParallelismConfig, GradientState._set_sync_gradients ------------------------------------------------------------

def test_parallelism_config_is_the_modules_class():
    import acc.parallelism_config

    assert acc.ParallelismConfig is acc.parallelism_config.ParallelismConfig


def test_set_sync_gradients_sets_what_sync_gradients_reads(fresh_pm):
    from acc.state import GradientState

    accelerator = acc.Accelerator(plugin_manager=fresh_pm)
    state = GradientState()
    assert state.sync_gradients is True
    try:
        state._set_sync_gradients(False)
        assert state.sync_gradients is False and GradientState().sync_gradients is False
        assert accelerator.sync_gradients is False
    finally:
        state._set_sync_gradients(True)
    assert GradientState().sync_gradients is True and accelerator.sync_gradients is True
