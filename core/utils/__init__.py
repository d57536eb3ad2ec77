"""The names Accelerate users import from `accelerate.utils`, so migrating is changing the import line:
`from accelerate.utils import ProjectConfiguration, set_seed` -> `from acc.utils import ...`.

Accelerate's submodule paths work too (`acc.utils.dataclasses`, `.memory`, `.imports`, `.environment`,
`.other`, `.operations`, `.modeling`, `.offload`, `.random`, `.constants`, `.versions`, `.fsdp_utils`,
`.deepspeed`), each name being the same object
here and there. Importing this package is torch-free; each name imports what it needs when first touched.
To add a name, add one `_LAZY` entry: name -> (module under `acc`, attribute).

A face: it imports the role packages below it (lazily, name by name), never the CLI.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from acc.compat import lazy_names
from acc.contract.kwargs import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs

_IMPORTS = (  # acc.utils.imports: the is_*_available checks
    "is_4bit_bnb_available", "is_8bit_bnb_available", "is_aim_available", "is_bf16_available", "is_bnb_available",
    "is_bitsandbytes_multi_backend_available", "is_import_timer_available",
    "is_boto3_available", "is_clearml_available", "is_comet_ml_available", "is_cuda_available",
    "is_datasets_available", "is_deepspeed_available", "is_dvclive_available", "is_fp16_available",
    "is_fp8_available", "is_hpu_available", "is_ipex_available", "is_lomo_available", "is_matplotlib_available",
    "is_megatron_lm_available", "is_mlflow_available", "is_mlu_available", "is_mps_available", "is_msamp_available",
    "is_musa_available", "is_npu_available", "is_numpy_available", "is_pandas_available", "is_peft_available",
    "is_pippy_available", "is_pynvml_available", "is_pytest_available", "is_rich_available",
    "is_safetensors_available", "is_sagemaker_available", "is_schedulefree_available", "is_sdaa_available",
    "is_swanlab_available", "is_tensorboard_available", "is_timm_available", "is_torch_xla_available",
    "is_torchao_available", "is_torchdata_available", "is_torchdata_stateful_dataloader_available",
    "is_torchvision_available", "is_tpu_available", "is_tqdm_available", "is_trackio_available",
    "is_transformer_engine_available", "is_transformers_available", "is_triton_available", "is_wandb_available",
    "is_weights_only_available", "is_xpu_available",
)

_DATACLASSES = (
    "AORecipeKwargs", "BaseEnum", "BnbQuantizationConfig", "CustomDtype", "DataLoaderConfiguration",
    "DeepSpeedSequenceParallelConfig", "DistributedType", "EnumWithContains", "FP8BackendType", "FP8RecipeKwargs",
    "GradientAccumulationPlugin", "MSAMPRecipeKwargs", "MegatronLMPlugin", "SageMakerDistributedType",
    "TERecipeKwargs", "TensorInformation", "TorchContextParallelConfig", "TorchTensorParallelConfig",
    "TorchTensorParallelPlugin",
)
_CONSTANTS = (
    "MITA_PROFILING_AVAILABLE_PYTORCH_VERSION", "MODEL_NAME", "OPTIMIZER_NAME", "PROFILE_PATTERN_NAME",
    "RNG_STATE_NAME", "SAFE_MODEL_NAME", "SAFE_WEIGHTS_INDEX_NAME", "SAFE_WEIGHTS_NAME", "SAFE_WEIGHTS_PATTERN_NAME",
    "SAMPLER_NAME", "SCALER_NAME", "SCHEDULER_NAME", "TORCH_DISTRIBUTED_OPERATION_TYPES", "TORCH_LAUNCH_PARAMS",
    "WEIGHTS_INDEX_NAME", "WEIGHTS_NAME", "WEIGHTS_PATTERN_NAME", "XPU_PROFILING_AVAILABLE_PYTORCH_VERSION",
)

_LAZY = {
    "set_seed": ("acc.runtime.seeding", "set_seed"),
    "ProjectConfiguration": ("acc.checkpointing.files", "ProjectConfiguration"),
    "send_to_device": ("acc.runtime.ops", "send_to_device"),
    # dataclasses: enumerations and the kwargs base class
    "KwargsHandler": ("acc.contract.kwargs", "KwargsHandler"),
    "ComputeEnvironment": ("acc.contract.enums", "ComputeEnvironment"),
    "DDPCommunicationHookType": ("acc.contract.enums", "DDPCommunicationHookType"),
    "DynamoBackend": ("acc.contract.enums", "DynamoBackend"),
    "LoggerType": ("acc.contract.enums", "LoggerType"),
    "PrecisionType": ("acc.contract.enums", "PrecisionType"),
    "RNGType": ("acc.contract.enums", "RNGType"),
    # environment
    "are_libraries_initialized": ("acc.utils.environment", "are_libraries_initialized"),
    "clear_environment": ("acc.utils.environment", "clear_environment"),
    "get_int_from_env": ("acc.utils.environment", "get_int_from_env"),
    "parse_choice_from_env": ("acc.utils.environment", "parse_choice_from_env"),
    "parse_flag_from_env": ("acc.utils.environment", "parse_flag_from_env"),
    "patch_environment": ("acc.utils.environment", "patch_environment"),
    "str_to_bool": ("acc.utils.environment", "str_to_bool"),
    # imports
    **{name: ("acc.utils.imports", name) for name in _IMPORTS},
    # versions
    "compare_versions": ("acc.utils.versions", "compare_versions"),
    "is_torch_version": ("acc.utils.versions", "is_torch_version"),
    # memory
    "clear_device_cache": ("acc.utils.memory", "clear_device_cache"),
    "find_executable_batch_size": ("acc.utils.memory", "find_executable_batch_size"),
    "release_memory": ("acc.utils.memory", "release_memory"),
    "should_reduce_batch_size": ("acc.utils.memory", "should_reduce_batch_size"),
    # operations
    "convert_outputs_to_fp32": ("acc.utils.operations", "convert_outputs_to_fp32"),
    "convert_to_fp32": ("acc.utils.operations", "convert_to_fp32"),
    "find_batch_size": ("acc.utils.operations", "find_batch_size"),
    "find_device": ("acc.utils.operations", "find_device"),
    "honor_type": ("acc.utils.operations", "honor_type"),
    "ignorant_find_batch_size": ("acc.utils.operations", "ignorant_find_batch_size"),
    "is_namedtuple": ("acc.utils.operations", "is_namedtuple"),
    "is_torch_tensor": ("acc.utils.operations", "is_torch_tensor"),
    "listify": ("acc.utils.operations", "listify"),
    "recursively_apply": ("acc.utils.operations", "recursively_apply"),
    **{name: ("acc.utils.operations", name) for name in (
        "broadcast", "broadcast_object_list", "concatenate", "gather", "gather_object", "pad_across_processes",
        "reduce", "slice_tensors", "synchronize_rng_state", "synchronize_rng_states", "wait_for_everyone")},
    # the run's state and its configuration dataclasses
    "DistributedType": ("acc.contract.enums", "DistributedType"),
    "DataLoaderConfiguration": ("acc.contract.kwargs", "DataLoaderConfiguration"),
    "GradientAccumulationPlugin": ("acc.contract.kwargs", "GradientAccumulationPlugin"),
    "DeepSpeedPlugin": ("acc.compat.plugin_objects", "DeepSpeedPlugin"),
    "FullyShardedDataParallelPlugin": ("acc.compat.plugin_objects", "FullyShardedDataParallelPlugin"),
    "TorchDynamoPlugin": ("acc.compat.plugin_objects", "TorchDynamoPlugin"),
    "ProfileKwargs": ("acc.compat.plugin_objects", "ProfileKwargs"),
    # deepspeed: the placeholders for a DeepSpeed config's optimizer and scheduler
    "DummyOptim": ("acc.runtime.placeholders", "DummyOptim"),
    "DummyScheduler": ("acc.runtime.placeholders", "DummyScheduler"),
    "skip_first_batches": ("acc.runtime.data.loader", "skip_first_batches"),
    # modeling (the device-map names are acc.big_model's)
    "check_device_map": ("acc.big_model", "check_device_map"),
    "compute_module_sizes": ("acc.big_model", "compute_module_sizes"),
    "get_balanced_memory": ("acc.big_model", "get_balanced_memory"),
    "get_max_memory": ("acc.big_model", "get_max_memory"),
    "infer_auto_device_map": ("acc.big_model", "infer_auto_device_map"),
    "load_checkpoint_in_model": ("acc.big_model", "load_checkpoint_in_model"),
    "find_tied_parameters": ("acc.utils.modeling", "find_tied_parameters"),
    "get_max_layer_size": ("acc.utils.modeling", "get_max_layer_size"),
    "load_state_dict": ("acc.utils.modeling", "load_state_dict"),
    "named_module_tensors": ("acc.utils.modeling", "named_module_tensors"),
    "retie_parameters": ("acc.utils.modeling", "retie_parameters"),
    "set_module_tensor_to_device": ("acc.utils.modeling", "set_module_tensor_to_device"),
    **{name: ("acc.utils.modeling", name) for name in (
        "align_module_device", "compute_module_total_buffer_size", "convert_file_size_to_int", "dtype_byte_size",
        "get_module_size_with_ties", "get_state_dict_from_offload", "get_state_dict_offloaded_model",
        "has_offloaded_params", "clean_device_map")},
    # offload
    **{name: ("acc.utils.offload", name) for name in (
        "OffloadedWeightsLoader", "PrefixedDataset", "extract_submodules_state_dict", "load_offloaded_weight",
        "load_offloaded_weights", "offload_state_dict", "offload_weight", "save_offload_index")},
    # other
    "clean_state_dict_for_safetensors": ("acc.utils.other", "clean_state_dict_for_safetensors"),
    "convert_bytes": ("acc.utils.other", "convert_bytes"),
    "extract_model_from_parallel": ("acc.utils.other", "extract_model_from_parallel"),
    "get_pretty_name": ("acc.utils.other", "get_pretty_name"),
    "has_compiled_regions": ("acc.utils.other", "has_compiled_regions"),
    **{name: ("acc.utils.other", name) for name in ("compile_regions", "compile_regions_deepspeed",
                                                    "compile_regions_fsdp2", "has_repeated_blocks",
                                                    "is_repeated_blocks")},
    "is_compiled_module": ("acc.utils.other", "is_compiled_module"),
    "is_port_in_use": ("acc.utils.other", "is_port_in_use"),
    "prepare_simple_launcher_cmd_env": ("acc.utils.launch", "prepare_simple_launcher_cmd_env"),
    "PrepareForLaunch": ("acc.utils.launch", "PrepareForLaunch"),
    "MegatronLMDummyScheduler": ("acc.compat.recipes", "MegatronLMDummyScheduler"),
    "has_4bit_bnb_layers": ("acc.utils.bnb", "has_4bit_bnb_layers"),
    "has_ao_layers": ("acc.utils.ao", "has_ao_layers"),
    "has_transformer_engine_layers": ("acc.utils.transformer_engine", "has_transformer_engine_layers"),
    "load_and_quantize_model": ("acc.utils.bnb", "load_and_quantize_model"),
    "prepare_multi_gpu_env": ("acc.utils.launch", "prepare_multi_gpu_env"),
    "_filter_args": ("acc.utils.launch", "_filter_args"),
    "load": ("acc.utils.other", "load"),
    "merge_dicts": ("acc.utils.other", "merge_dicts"),
    "recursive_getattr": ("acc.utils.other", "recursive_getattr"),
    "save": ("acc.utils.other", "save"),
    "write_basic_config": ("acc.utils.other", "write_basic_config"),
    # fsdp_utils
    "merge_fsdp_weights": ("acc.utils.fsdp_utils", "merge_fsdp_weights"),
    **{name: ("acc.utils.fsdp_utils", name) for name in ("load_fsdp_model", "load_fsdp_optimizer", "save_fsdp_model",
                                                         "save_fsdp_optimizer")},
    # deepspeed
    "DeepSpeedSchedulerWrapper": ("acc.utils.deepspeed", "DeepSpeedSchedulerWrapper"),
    "HfDeepSpeedConfig": ("acc.utils.deepspeed", "HfDeepSpeedConfig"),
    # tqdm (the function; acc.utils has no `tqdm` submodule that could shadow it)
    "tqdm": ("acc.utils._tqdm", "tqdm"),
    # every name of acc.utils.dataclasses, the constants, the N-D parallelism configuration
    **{name: ("acc.utils.dataclasses", name) for name in _DATACLASSES},
    **{name: ("acc.utils.constants", name) for name in _CONSTANTS},
    "ParallelismConfig": ("acc.parallelism_config", "ParallelismConfig"),
    "get_module_class_from_name": ("acc.utils.dataclasses", "get_module_class_from_name"),
    "CannotPadNestedTensorWarning": ("acc.runtime.collectives", "CannotPadNestedTensorWarning"),
    "DistributedOperationException": ("acc.runtime.collectives", "DistributedOperationException"),
    "pad_input_tensors": ("acc.utils.operations", "pad_input_tensors"),
    "check_os_kernel": ("acc.utils.other", "check_os_kernel"),
    "get_model_tp_size": ("acc.utils.other", "get_model_tp_size"),
    "convert_dict_to_env_variables": ("acc.compat.environment", "convert_dict_to_env_variables"),
    "purge_accelerate_environment": ("acc.compat.environment", "purge_accelerate_environment"),
}

if TYPE_CHECKING:  # pragma: no cover
    from acc.checkpointing.files import ProjectConfiguration
    from acc.runtime.ops import send_to_device
    from acc.runtime.seeding import set_seed


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return lazy_names.resolve(globals(), _LAZY, name)
    from acc.errors import did_you_mean

    raise AttributeError(f"module 'acc.utils' has no attribute {name!r}{did_you_mean(name, list(_LAZY))} (acc keeps "
                         f"{len(__all__)} of the accelerate.utils names, listed in acc.utils.__all__; the rest of the "
                         "API is on Accelerator)")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


__all__ = sorted(["AutocastKwargs", "DistributedDataParallelKwargs", "GradScalerKwargs", "InitProcessGroupKwargs",
                  *_LAZY])
