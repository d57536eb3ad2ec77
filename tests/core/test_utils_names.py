"""`acc.utils` keeps the `accelerate.utils` names a migrating script imports."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

import acc
import acc.utils
from acc.checkpointing.files import ProjectConfiguration
from acc.runtime.ops import send_to_device
from acc.runtime.seeding import set_seed


def test_the_accelerate_utils_names_are_the_kernels_own_objects():
    from acc.utils import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs
    from acc.utils import ProjectConfiguration as P
    from acc.utils import send_to_device as s
    from acc.utils import set_seed as seed

    assert (P, s, seed) == (ProjectConfiguration, send_to_device, set_seed)
    assert (AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs) == (
        acc.AutocastKwargs, acc.DistributedDataParallelKwargs, acc.GradScalerKwargs, acc.InitProcessGroupKwargs)
    assert acc.ProjectConfiguration is ProjectConfiguration


def test_an_unknown_name_says_which_names_exist():
    with pytest.raises(AttributeError, match=r"'set_sead' \(did you mean 'set_seed'\?\).*acc.utils.__all__"):
        acc.utils.set_sead  # noqa: B018
    with pytest.raises(AttributeError, match=r"'no_such_helper' \(acc keeps \d+ of the accelerate.utils names"):
        acc.utils.no_such_helper  # noqa: B018


def test_importing_acc_utils_does_not_import_torch():
    code = "import sys, acc.utils; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_the_torch_free_submodules_and_checks_stay_torch_free():
    code = ("import sys, acc.utils.dataclasses, acc.utils.environment, acc.utils.imports, acc.utils.versions\n"
            "from acc.utils import LoggerType, PrecisionType, patch_environment, write_basic_config, tqdm\n"
            "from acc.utils.imports import __all__ as checks\n"
            "results = [getattr(acc.utils, name)() for name in checks if name != 'is_cuda_available']\n"
            "assert all(type(r) is bool for r in results), results\n"
            "print('torch' in sys.modules, len(checks))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "ACC_HARDWARE": '{"cuda": 0, "mps": false}'}).stdout.split()
    assert out[0] == "False" and int(out[1]) >= 40


# where Accelerate defines each name: a script importing it from that submodule gets acc's object
ACCELERATE_PATHS = {
    "dataclasses": ["AutocastKwargs", "ComputeEnvironment", "DDPCommunicationHookType", "DistributedDataParallelKwargs",
                    "DynamoBackend", "GradScalerKwargs", "InitProcessGroupKwargs", "KwargsHandler", "LoggerType",
                    "PrecisionType", "ProjectConfiguration", "RNGType"],
    "environment": ["clear_environment", "patch_environment", "parse_flag_from_env", "str_to_bool",
                    "get_int_from_env", "are_libraries_initialized"],
    "imports": ["is_tensorboard_available", "is_wandb_available", "is_comet_ml_available", "is_mlflow_available",
                "is_aim_available", "is_clearml_available", "is_dvclive_available", "is_datasets_available",
                "is_transformers_available", "is_peft_available", "is_deepspeed_available",
                "is_torch_xla_available", "is_tpu_available", "is_cuda_available", "is_mps_available",
                "is_xpu_available", "is_npu_available", "is_mlu_available", "is_bf16_available", "is_fp8_available",
                "is_rich_available", "is_schedulefree_available", "is_torchao_available",
                "is_transformer_engine_available", "is_safetensors_available", "is_boto3_available",
                "is_pandas_available", "is_timm_available", "is_bnb_available", "is_megatron_lm_available",
                "is_msamp_available", "is_pippy_available", "is_torchvision_available", "is_lomo_available",
                "is_ipex_available", "is_sagemaker_available"],
    "memory": ["find_executable_batch_size", "release_memory", "clear_device_cache", "should_reduce_batch_size"],
    "other": ["extract_model_from_parallel", "is_compiled_module", "get_pretty_name", "save", "load",
              "write_basic_config", "merge_dicts", "convert_bytes", "recursive_getattr"],
    "operations": ["convert_outputs_to_fp32", "find_batch_size", "recursively_apply", "honor_type", "listify",
                   "send_to_device", "convert_to_fp32", "find_device"],
    "modeling": ["set_module_tensor_to_device", "find_tied_parameters", "get_max_layer_size", "load_state_dict",
                 "check_device_map", "compute_module_sizes", "get_balanced_memory", "get_max_memory",
                 "infer_auto_device_map", "load_checkpoint_in_model"],
    "versions": ["compare_versions", "is_torch_version"],
    "fsdp_utils": ["merge_fsdp_weights"],
}


@pytest.mark.parametrize("submodule", sorted(ACCELERATE_PATHS))
def test_names_import_from_acc_utils_and_from_accelerates_submodule(submodule):
    import importlib

    module = importlib.import_module(f"acc.utils.{submodule}")
    for name in ACCELERATE_PATHS[submodule]:
        assert getattr(module, name) is getattr(acc.utils, name), f"acc.utils.{submodule}.{name}"
        assert name in acc.utils.__all__


def test_tqdm_is_the_function_and_the_module_aliases_hold():
    import acc.big_model
    import acc.big_modeling
    import acc.hooks
    from acc.utils import tqdm

    assert callable(tqdm) and acc.utils.tqdm is tqdm and tqdm.__module__ == "acc.utils._tqdm"
    assert acc.big_modeling is acc.big_model
    from acc.big_modeling import cpu_offload_with_hook, init_on_device

    assert acc.cpu_offload_with_hook is cpu_offload_with_hook and acc.init_on_device is init_on_device
    assert acc.load_checkpoint_in_model is acc.big_model.load_checkpoint_in_model is acc.utils.load_checkpoint_in_model
    assert acc.find_executable_batch_size is acc.utils.find_executable_batch_size
    assert acc.DDPCommunicationHookType is acc.utils.DDPCommunicationHookType
    assert acc.big_model.add_hook_to_module is acc.hooks.add_hook_to_module
    for name in ("cpu_offload_with_hook", "init_on_device", "load_checkpoint_in_model", "find_executable_batch_size"):
        assert name in acc.__all__
