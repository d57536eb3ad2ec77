"""Accelerate's backend plugin objects: names and defaults, their mapping onto acc's backend settings, and the
fields acc refuses (with the field, its value and what acc offers). In-process, no torch needed except where
torch's own objects are given."""

from __future__ import annotations

import dataclasses
import subprocess
import sys

import pytest

import acc
import acc.utils
import acc.utils.dataclasses
from acc import AccError
from acc.compat.plugin_objects import DeepSpeedPlugin, FullyShardedDataParallelPlugin, ProfileKwargs, TorchDynamoPlugin

NAMES = ("DeepSpeedPlugin", "FullyShardedDataParallelPlugin", "TorchDynamoPlugin", "ProfileKwargs")


@pytest.mark.parametrize("name", NAMES)
def test_one_object_under_every_path(name):
    obj = getattr(acc.compat.plugin_objects, name)
    assert getattr(acc, name) is getattr(acc.utils, name) is getattr(acc.utils.dataclasses, name) is obj
    assert name in acc.__all__ and name in acc.utils.__all__ and name in acc.utils.dataclasses.__all__


def test_importing_them_stays_torch_free():
    code = ("import sys\nfrom acc.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin, TorchDynamoPlugin, "
            "ProfileKwargs, DummyOptim, DummyScheduler\n"
            "DeepSpeedPlugin(zero_stage=3).to_settings(); FullyShardedDataParallelPlugin(cpu_offload=True).to_settings()\n"
            "TorchDynamoPlugin(backend='inductor').to_kwargs(); ProfileKwargs(with_flops=True).to_kwargs()\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


# Accelerate 1.15's fields and defaults (as written in its dataclasses.py)
ACCELERATE_FIELDS = {
    DeepSpeedPlugin: {"hf_ds_config": None, "gradient_accumulation_steps": None, "gradient_clipping": None,
                      "zero_stage": None, "is_train_batch_min": True, "offload_optimizer_device": None,
                      "offload_param_device": None, "offload_optimizer_nvme_path": None,
                      "offload_param_nvme_path": None, "zero3_init_flag": None, "zero3_save_16bit_model": None,
                      "transformer_moe_cls_names": None, "enable_msamp": None, "msamp_opt_level": None},
    FullyShardedDataParallelPlugin: {
        "fsdp_version": None, "sharding_strategy": None, "reshard_after_forward": None, "backward_prefetch": None,
        "mixed_precision_policy": None, "auto_wrap_policy": None, "cpu_offload": None, "ignored_modules": None,
        "state_dict_type": None, "state_dict_config": None, "optim_state_dict_config": None,
        "limit_all_gathers": True, "use_orig_params": None, "param_init_fn": None, "sync_module_states": None,
        "forward_prefetch": None, "activation_checkpointing": None, "cpu_ram_efficient_loading": None,
        "transformer_cls_names_to_wrap": None, "min_num_params": None},
    TorchDynamoPlugin: {"backend": None, "mode": None, "fullgraph": None, "dynamic": None, "options": None,
                        "disable": False, "use_regional_compilation": None},
    ProfileKwargs: {"activities": None, "schedule_option": None, "on_trace_ready": None, "record_shapes": False,
                    "profile_memory": False, "with_stack": False, "with_flops": False, "with_modules": False,
                    "output_trace_dir": None},
}


@pytest.mark.parametrize("cls", list(ACCELERATE_FIELDS))
def test_fields_and_defaults_are_accelerates(cls):
    assert {f.name: f.default for f in dataclasses.fields(cls)} == ACCELERATE_FIELDS[cls]
    assert list(ACCELERATE_FIELDS[cls]) == [f.name for f in dataclasses.fields(cls)]  # positional order too


def test_the_backend_each_configures():
    assert DeepSpeedPlugin().backend == "deepspeed" and FullyShardedDataParallelPlugin().backend == "fsdp"


# ---------------------------------------------------------------------------------------------- DeepSpeedPlugin


def test_deepspeed_defaults_set_nothing():
    assert DeepSpeedPlugin().to_settings() == {}
    # Accelerate's spellings of "not given"
    assert DeepSpeedPlugin(hf_ds_config="none", gradient_accumulation_steps="auto", gradient_clipping="auto",
                           offload_optimizer_device="none", offload_param_device="none",
                           offload_optimizer_nvme_path="none", offload_param_nvme_path="none",
                           zero3_init_flag=False, zero3_save_16bit_model=True, msamp_opt_level="O1").to_settings() == {}


def test_deepspeed_fields_map_onto_the_backends_settings(tmp_path):
    path = tmp_path / "ds.json"
    plugin = DeepSpeedPlugin(hf_ds_config=str(path), gradient_accumulation_steps=4, gradient_clipping=1,
                             zero_stage=3, offload_optimizer_device="cpu", offload_param_device="cpu")
    assert plugin.to_settings() == {"deepspeed_config": str(path), "gradient_accumulation_steps": 4,
                                    "gradient_clipping": 1.0, "zero_stage": 3, "offload_optimizer": "cpu",
                                    "offload_params": "cpu"}
    assert DeepSpeedPlugin(hf_ds_config=path).to_settings() == {"deepspeed_config": str(path)}  # a Path too
    assert DeepSpeedPlugin(zero_stage=0).to_settings() == {"zero_stage": 0}


def test_a_config_given_as_a_dict_reaches_the_backend_as_its_json():
    from acc_deepspeed.config import describe, read_user_config

    config = {"zero_optimization": {"stage": 3}, "optimizer": {"type": "AdamW", "params": {"lr": "auto"}}}
    value = DeepSpeedPlugin(hf_ds_config=config).to_settings()["deepspeed_config"]
    assert read_user_config(value) == config and describe(value) == "the DeepSpeed config given in code"

    class HfDeepSpeedConfig:  # transformers' / Accelerate's wrapper: the dict is its `config`
        def __init__(self, config):
            self.config = config

    assert DeepSpeedPlugin(hf_ds_config=HfDeepSpeedConfig(config)).to_settings() == {"deepspeed_config": value}


def test_the_mapped_values_pass_the_backends_own_setting_checks():
    from acc.contract.settings import SettingsRegistry
    from acc_deepspeed import plugin as ds_plugin

    registry = SettingsRegistry()
    ds_plugin.acc_add_settings(registry.scoped("deepspeed"))
    values = DeepSpeedPlugin(hf_ds_config={"a": 1}, gradient_clipping=2, zero_stage=2,
                             offload_optimizer_device="CPU").to_settings()
    for name, value in values.items():
        assert registry[name].convert(value) == value


@pytest.mark.parametrize("fields,fragment", [
    ({"offload_optimizer_device": "nvme"}, "DeepSpeedPlugin(offload_optimizer_device='nvme'): acc offloads ZeRO state "
     "to the CPU only: offload_optimizer_device=\"cpu\""),
    ({"offload_param_device": "nvme"}, "DeepSpeedPlugin(offload_param_device='nvme'): acc offloads ZeRO state to the "
     "CPU only"),
    ({"offload_optimizer_nvme_path": "/nvme"}, "DeepSpeedPlugin(offload_optimizer_nvme_path='/nvme'): acc has no NVMe "
     "offload; offload to the CPU instead"),
    ({"offload_param_nvme_path": "/local_nvme"}, "DeepSpeedPlugin(offload_param_nvme_path='/local_nvme'): acc has no "
     "NVMe offload"),
    ({"zero3_init_flag": True}, "DeepSpeedPlugin(zero3_init_flag=True): acc does not build the model under "
     "deepspeed.zero.Init; every process builds it and ZeRO-3 partitions it in prepare()"),
    ({"transformer_moe_cls_names": "MixtralSparseMoeBlock"}, "DeepSpeedPlugin(transformer_moe_cls_names="
     "'MixtralSparseMoeBlock'): acc does not mark MoE leaf modules yet; call deepspeed.utils.set_z3_leaf_modules"),
    ({"enable_msamp": True}, "DeepSpeedPlugin(enable_msamp=True): acc has no fp8 (MS-AMP)"),
    ({"is_train_batch_min": False}, "DeepSpeedPlugin(is_train_batch_min=False): acc takes the micro batch size from "
     "the first DataLoader prepared with the model"),
    ({"zero_stage": 4}, "DeepSpeedPlugin(zero_stage=4): ZeRO stages are 0, 1, 2 and 3"),
    ({"gradient_accumulation_steps": 0}, "DeepSpeedPlugin(gradient_accumulation_steps=0): give a positive integer"),
    ({"gradient_clipping": "big"}, "DeepSpeedPlugin(gradient_clipping='big'): give a total norm >= 0"),
    ({"hf_ds_config": 7}, "DeepSpeedPlugin(hf_ds_config=7): give a DeepSpeed JSON file's path, a dict"),
    ({"hf_ds_config": {"x": object()}}, "the config must be JSON data"),
])
def test_deepspeed_fields_acc_cannot_honour_are_refused_by_name(fields, fragment):
    with pytest.raises(AccError) as info:
        DeepSpeedPlugin(**fields).to_settings()
    assert fragment in str(info.value)


def test_every_refused_deepspeed_field_is_listed_at_once():
    with pytest.raises(AccError) as info:
        DeepSpeedPlugin(offload_param_device="nvme", zero3_init_flag=True, zero_stage=3).to_settings()
    text = str(info.value)
    assert text.startswith("2 fields acc cannot honour:") and "offload_param_device='nvme'" in text
    assert "zero3_init_flag=True" in text


# ---------------------------------------------------------------------------------------------- FSDP


def fsdp(**fields):
    return FullyShardedDataParallelPlugin(**fields).to_settings()


def test_transformer_based_wrap_without_classes_wraps_the_models_no_split_modules():
    assert fsdp(auto_wrap_policy="transformer_based_wrap")["fsdp_wrap"] == "no_split_modules"
    assert fsdp(auto_wrap_policy="transformer_based_wrap",
                transformer_cls_names_to_wrap=["LlamaDecoderLayer"])["fsdp_wrap"] == "transformer_layer=LlamaDecoderLayer"


def test_fsdp_defaults_set_nothing():
    assert fsdp() == {}
    assert fsdp(fsdp_version=2, activation_checkpointing=False, forward_prefetch=False,
                state_dict_type="SHARDED_STATE_DICT") == {}


@pytest.mark.parametrize("fields,settings", [
    ({"sharding_strategy": "FULL_SHARD"}, {"fsdp_strategy": "full_shard"}),
    ({"sharding_strategy": "SHARD_GRAD_OP"}, {"fsdp_strategy": "shard_grad_op"}),
    ({"sharding_strategy": 4}, {"fsdp_strategy": "hybrid_shard"}),  # torch's ShardingStrategy values
    ({"reshard_after_forward": True}, {"fsdp_strategy": "full_shard"}),
    ({"reshard_after_forward": False, "fsdp_version": 2}, {"fsdp_strategy": "shard_grad_op"}),
    ({"cpu_offload": True}, {"fsdp_cpu_offload": True}),
    ({"cpu_offload": False}, {"fsdp_cpu_offload": False}),
    # rank 0's weights, the others' shards scattered at prepare (Accelerate's FSDP2 / FSDP1 names for it)
    ({"cpu_ram_efficient_loading": True}, {"fsdp_from_rank0": True}),
    ({"sync_module_states": True}, {"fsdp_from_rank0": True}),
    ({"cpu_ram_efficient_loading": False, "sync_module_states": True}, {"fsdp_from_rank0": True}),
    ({"cpu_ram_efficient_loading": False}, {"fsdp_from_rank0": False}),
    ({"auto_wrap_policy": "transformer_based_wrap", "transformer_cls_names_to_wrap": ["Block", "Head"]},
     {"fsdp_wrap": "transformer_layer=Block,Head"}),
    ({"auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "transformer_cls_names_to_wrap": "Block"},
     {"fsdp_wrap": "transformer_layer=Block"}),
    ({"auto_wrap_policy": "size_based_wrap", "min_num_params": 1000}, {"fsdp_wrap": "min_params=1000"}),
    ({"auto_wrap_policy": "size_based_wrap"}, {"fsdp_wrap": ""}),  # Accelerate: min_num_params 0 wraps nothing
    ({"auto_wrap_policy": "no_wrap"}, {"fsdp_wrap": ""}),
])
def test_fsdp_fields_map_onto_the_backends_settings(fields, settings):
    assert fsdp(**fields) == settings


def test_torch_objects_are_read_by_name():
    pytest.importorskip("torch")
    import functools

    from torch import nn
    from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, OffloadPolicy, ShardingStrategy
    from torch.distributed.fsdp.fully_sharded_data_parallel import StateDictType
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

    assert fsdp(sharding_strategy=ShardingStrategy.SHARD_GRAD_OP) == {"fsdp_strategy": "shard_grad_op"}
    assert fsdp(cpu_offload=CPUOffloadPolicy()) == fsdp(cpu_offload=CPUOffload(offload_params=True)) == {
        "fsdp_cpu_offload": True}
    assert fsdp(cpu_offload=OffloadPolicy()) == {"fsdp_cpu_offload": False}
    assert fsdp(state_dict_type=StateDictType.SHARDED_STATE_DICT) == {}
    policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={nn.TransformerEncoderLayer})
    assert fsdp(auto_wrap_policy=policy) == {"fsdp_wrap": "transformer_layer=TransformerEncoderLayer"}
    assert fsdp(auto_wrap_policy=transformer_auto_wrap_policy, transformer_cls_names_to_wrap=["Block"]) == {
        "fsdp_wrap": "transformer_layer=Block"}
    assert fsdp(auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=50)) == {
        "fsdp_wrap": "min_params=50"}
    with pytest.raises(AccError, match=r"CPUOffloadPolicy\(pin_memory=False\).*pass cpu_offload=True"):
        fsdp(cpu_offload=CPUOffloadPolicy(pin_memory=False))


def test_the_mapped_fsdp_values_pass_the_backends_own_setting_checks():
    from acc.contract.settings import SettingsRegistry
    from acc_fsdp import plugin as fsdp_plugin

    registry = SettingsRegistry()
    fsdp_plugin.acc_add_settings(registry.scoped("fsdp"))
    values = fsdp(sharding_strategy="HYBRID_SHARD", cpu_offload=True, auto_wrap_policy="size_based_wrap",
                  min_num_params=10)
    assert set(values) == {"fsdp_strategy", "fsdp_cpu_offload", "fsdp_wrap"}
    for name, value in values.items():
        assert registry[name].convert(value) == value
    assert fsdp_plugin.parse_wrap(values["fsdp_wrap"]) == ("min_params", 10)


@pytest.mark.parametrize("fields,fragment", [
    ({"fsdp_version": 1}, "FullyShardedDataParallelPlugin(fsdp_version=1): acc's fsdp backend runs FSDP2 (torch's "
     "fully_shard), not FSDP1's FullyShardedDataParallel wrapper: pass fsdp_version=2"),
    ({"fsdp_version": 3}, "FullyShardedDataParallelPlugin(fsdp_version=3): FSDP versions are 1 and 2; acc runs 2"),
    ({"activation_checkpointing": True}, "FullyShardedDataParallelPlugin(activation_checkpointing=True): "
     "fsdp_activation_checkpointing true is not supported by acc's fsdp backend yet: acc has no "
     "activation-checkpointing setting yet; use torch.utils.checkpoint in the model"),
    ({"forward_prefetch": True}, "FullyShardedDataParallelPlugin(forward_prefetch=True): fsdp_forward_prefetch true "
     "is not supported by acc's fsdp backend yet: FSDP2 has no forward prefetch option"),
    ({"sharding_strategy": "NO_SHARD"}, "FullyShardedDataParallelPlugin(sharding_strategy='NO_SHARD'): NO_SHARD is "
     "not supported by acc's fsdp backend yet: use ddp"),
    ({"state_dict_type": "LOCAL_STATE_DICT"}, "FullyShardedDataParallelPlugin(state_dict_type='LOCAL_STATE_DICT'): "
     "fsdp_state_dict_type LOCAL_STATE_DICT is not supported by acc's fsdp backend: save_state writes each process's "
     "shard"),
    ({"mixed_precision_policy": "bf16"}, "FullyShardedDataParallelPlugin(mixed_precision_policy='bf16'): acc's fsdp "
     "backend takes mixed precision from mixed_precision (Accelerator(mixed_precision=\"bf16\")"),
    ({"param_init_fn": print}, "FullyShardedDataParallelPlugin(param_init_fn=<built-in function print>): acc's fsdp "
     "backend shards the model as the script built it"),
    ({"state_dict_config": {"offload_to_cpu": True}}, "FullyShardedDataParallelPlugin(state_dict_config="
     "{'offload_to_cpu': True}): acc's save_state writes each process's shard"),
    ({"optim_state_dict_config": "x"}, "FullyShardedDataParallelPlugin(optim_state_dict_config='x')"),
    ({"ignored_modules": ["head"]}, "FullyShardedDataParallelPlugin(ignored_modules=['head']): fsdp_ignored_modules "
     "is not supported"),
    ({"auto_wrap_policy": lambda *a, **k: True}, "acc wraps by class name (auto_wrap_policy=\"transformer_based_wrap"
     "\" with transformer_cls_names_to_wrap) or by size"),
    ({"transformer_cls_names_to_wrap": ["Block"]}, "the classes to wrap are used with fsdp_auto_wrap_policy "
     "TRANSFORMER_BASED_WRAP only"),
    ({"cpu_offload": "yes please"}, "FullyShardedDataParallelPlugin(cpu_offload='yes please'): give True/False"),
    ({"auto_wrap_policy": "size_based_wrap", "min_num_params": -1}, "FullyShardedDataParallelPlugin(min_num_params="
     "-1): give a number of parameters"),
])
def test_fsdp_fields_acc_cannot_honour_are_refused_by_name(fields, fragment):
    with pytest.raises(AccError) as info:
        fsdp(**fields)
    assert fragment in str(info.value)


@pytest.mark.parametrize("fields,fragment", [
    ({"backward_prefetch": "BACKWARD_PRE"}, "backward_prefetch='BACKWARD_PRE'): fsdp_backward_prefetch has no effect"),
    ({"use_orig_params": False}, "use_orig_params=False): fsdp_use_orig_params has no effect"),
    ({"limit_all_gathers": False}, "limit_all_gathers=False) has no effect: FSDP2"),
])
def test_fsdp1_only_fields_are_accepted_with_a_warning_as_accelerates_fsdp2_drops_them(fields, fragment):
    with pytest.warns(UserWarning) as record:
        assert fsdp(**fields) == {}
    assert any(fragment in str(w.message) for w in record), [str(w.message) for w in record]


def test_a_full_state_dict_is_taken_for_save_fsdp_model_saying_what_save_state_writes():
    with pytest.warns(UserWarning) as record:
        assert fsdp(state_dict_type="FULL_STATE_DICT") == {}
    assert any("FULL_STATE_DICT applies to save_fsdp_model" in str(w.message) and "save_state still writes each "
               "process's shard" in str(w.message) for w in record), [str(w.message) for w in record]


# ---------------------------------------------------------------------------------------------- kwargs handlers


def test_dynamo_plugin_gives_torch_compile_arguments():
    from acc.contract.enums import DynamoBackend

    plugin = TorchDynamoPlugin(backend="inductor", mode="max-autotune", fullgraph=True,
                               use_regional_compilation=True)
    assert plugin.backend is DynamoBackend.INDUCTOR
    assert plugin.to_kwargs() == {"backend": "inductor", "mode": "max-autotune", "fullgraph": True}
    assert TorchDynamoPlugin(backend=DynamoBackend.AOT_EAGER).to_kwargs() == {"backend": "aot_eager"}
    assert TorchDynamoPlugin().to_kwargs() == {} and TorchDynamoPlugin().backend is None  # None: the launch's
    assert TorchDynamoPlugin(dynamic=False, disable=True).to_kwargs() == {"dynamic": False, "disable": True}
    with pytest.raises(ValueError):
        TorchDynamoPlugin(backend="no-such-backend")
    assert isinstance(plugin, acc.utils.KwargsHandler)


def test_profile_kwargs_builds_a_torch_profiler():
    torch = pytest.importorskip("torch")

    traces = []
    kwargs = ProfileKwargs(activities=["cpu"], schedule_option={"wait": 1, "warmup": 1, "active": 1},
                           on_trace_ready=lambda p: traces.append(sorted({e.name for e in p.events()})),
                           record_shapes=True, with_flops=True)
    assert set(kwargs.to_kwargs()) == {"activities", "schedule_option", "on_trace_ready", "record_shapes",
                                       "with_flops"}
    profiler = kwargs.build()
    assert isinstance(profiler, torch.profiler.profile)
    assert profiler.activities == {torch.profiler.ProfilerActivity.CPU}
    assert profiler.record_shapes and profiler.with_flops and not profiler.profile_memory
    with profiler:
        for _ in range(3):  # wait, warmup, active: the trace of the third step is handed to on_trace_ready
            torch.ones(8, 8) @ torch.ones(8, 8)
            profiler.step()
    assert len(traces) == 1 and any("mm" in name for name in traces[0]), traces
    with pytest.raises(ValueError, match="Invalid profiler activity: tpu"):
        ProfileKwargs(activities=["tpu"]).build()
