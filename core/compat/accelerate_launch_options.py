"""`accelerate launch`'s options as Accelerate's argparse parser declares them: group, name, type, default and
choices (what `acc.commands.launch.launch_command_parser` builds, so a Namespace from it has Accelerate's fields
and defaults). How acc reads each option is `acc.compat.accelerate_launch.FLAGS`; a test keeps the two name sets
equal. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from acc.compat.accelerate_constants import TORCH_DYNAMO_MODES
from acc.contract.enums import DynamoBackend


@dataclass(frozen=True)
class Option:
    """One option. kind: flag (store_true), str, int, float, bool (argparse `type=bool`), truth (Accelerate's
    str_to_bool), append (repeatable str), truths (a comma-separated list of truth values)."""

    name: str
    kind: str = "str"
    default: Any = None
    choices: tuple[str, ...] | None = None
    short: str = ""
    dest: str = ""
    const_false: bool = False  # a store_false flag (--no_tpu_cluster)


def _flags(*names: str) -> list[Option]:
    return [Option(n, "flag", False) for n in names]


def _typed(kind: str, default: Any, *names: str) -> list[Option]:
    return [Option(n, kind, default) for n in names]


_DYNAMO = ("no", *[b.value.lower() for b in DynamoBackend if b.value != "NO"])
_FSDP_TRUTHS = [("fsdp_offload_params", "false"), ("fsdp_reshard_after_forward", "true"),
                ("fsdp_forward_prefetch", "false"), ("fsdp_use_orig_params", "true"),
                ("fsdp_cpu_ram_efficient_loading", "true"), ("fsdp_sync_module_states", "true"),
                ("fsdp_activation_checkpointing", "false"), ("fsdp_activation_checkpointing_offload", "false")]
_MEGATRON_STR = ("sequence_parallelism", "recompute_activations", "use_distributed_optimizer",
                 "recompute_granularity", "recompute_method", "attention_backend", "attention_softmax_in_fp32",
                 "calculate_per_token_loss", "use_rotary_position_embeddings")

GROUPS: list[tuple[str, str, list[Option]]] = [
    ("", "", [Option("config_file"), Option("quiet", "flag", False, short="-q")]),
    ("Hardware Selection Arguments", "Arguments for selecting the hardware to be used.",
     _flags("cpu", "multi_gpu", "tpu")),
    ("Resource Selection Arguments", "Arguments for fine-tuning how available hardware should be used.", [
        Option("mixed_precision", choices=("no", "fp16", "bf16", "fp8")),
        *_typed("int", None, "num_processes", "num_machines", "num_cpu_threads_per_process"),
        *_flags("enable_cpu_affinity"),
        Option("dynamo_backend", choices=_DYNAMO),
        Option("dynamo_mode", default="default", choices=tuple(TORCH_DYNAMO_MODES)),
        *_flags("dynamo_use_fullgraph", "dynamo_use_dynamic", "dynamo_use_regional_compilation")]),
    ("Training Paradigm Arguments", "Arguments for selecting which training paradigm to be used.",
     _flags("use_deepspeed", "use_fsdp", "use_parallelism_config", "use_megatron_lm")),
    ("Distributed GPUs", "Arguments related to distributed GPU training.", [
        Option("gpu_ids"), *_flags("same_network"), Option("machine_rank", "int"), Option("main_process_ip"),
        Option("main_process_port", "int"), Option("tee", default="0", short="-t"), Option("log_dir"),
        Option("role", default="default"), Option("rdzv_backend", default="static"), Option("rdzv_conf", default=""),
        Option("max_restarts", "int", 0), Option("monitor_interval", "float", 0.1),
        Option("module", "flag", False, short="-m"), *_flags("no_python")]),
    ("TPU", "Arguments related to TPU.", [
        Option("tpu_cluster", "flag", False, dest="tpu_use_cluster"),
        Option("no_tpu_cluster", "flag", False, dest="tpu_use_cluster", const_false=True),
        *_flags("tpu_use_sudo"), Option("vm", "append"), Option("env", "append"),
        Option("main_training_function"), *_flags("downcast_bf16")]),
    ("DeepSpeed Arguments", "Arguments related to DeepSpeed.", [
        Option("deepspeed_config_file"), Option("zero_stage", "int"), Option("offload_optimizer_device"),
        Option("offload_param_device"), Option("offload_optimizer_nvme_path"), Option("offload_param_nvme_path"),
        Option("gradient_accumulation_steps", "int"), Option("gradient_clipping", "float"),
        *_typed("str", None, "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile",
                "deepspeed_exclusion_filter", "deepspeed_inclusion_filter", "deepspeed_multinode_launcher",
                "deepspeed_moe_layer_cls_names")]),
    ("FSDP Arguments", "Arguments related to Fully Shared Data Parallelism.", [
        Option("fsdp_version", default="1", choices=("1", "2")),
        Option("fsdp_min_num_params", "int", 100_000_000), Option("fsdp_sharding_strategy", default="FULL_SHARD"),
        *_typed("str", None, "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
                "fsdp_backward_prefetch", "fsdp_state_dict_type"),
        *[Option(n, "str", d) for n, d in _FSDP_TRUTHS]]),
    ("Megatron-LM Arguments", "Arguments related to Megatron-LM.", [
        Option("megatron_lm_tp_degree", "int", 1), Option("megatron_lm_pp_degree", "int", 1),
        *_typed("bool", False, *[f"megatron_lm_{n}" for n in (
            "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d", "no_save_optim",
            "optimizer_cpu_offload", "use_precision_aware_optimizer")]),
        *_typed("int", None, *[f"megatron_lm_{n}" for n in (
            "decoder_last_pipeline_num_layers", "num_micro_batches", "recompute_num_layers",
            "expert_model_parallel_size", "context_parallel_size", "expert_tensor_parallel_size")]),
        *_typed("str", None, *[f"megatron_lm_{n}" for n in _MEGATRON_STR]),
        Option("megatron_lm_gradient_clipping", "float", 1.0),
        *_typed("float", None, "megatron_lm_attention_dropout", "megatron_lm_hidden_dropout")]),
    ("FP8 Arguments", "Arguments related to FP8 training (requires `--mixed_precision=fp8`)", [
        Option("fp8_backend", choices=("ao", "te", "msamp")), *_flags("fp8_use_autocast_during_eval"),
        Option("fp8_margin", "int", 0), Option("fp8_interval", "int", 1),
        Option("fp8_format", default="HYBRID", choices=("HYBRID", "E4M3", "E5M2")),
        Option("fp8_amax_history_len", "int", 1024),
        Option("fp8_amax_compute_algo", default="most_recent", choices=("max", "most_recent")),
        Option("fp8_override_linear_precision", "truths", (False, False, False)),
        Option("fp8_opt_level", default="O2", choices=("O1", "O2")),
        Option("fp8_enable_fsdp_float8_all_gather", "truth", "true"), Option("fp8_pad_inner_dim", "truth", "true")]),
    ("AWS Arguments", "Arguments related to AWS.", [Option("aws_access_key_id"), Option("aws_secret_access_key")]),
    ("", "", _flags("debug")),
    ("MPI Arguments", "Arguments related to mpirun for Multi-CPU", [Option("mpirun_hostfile")]),
    ("ParallelismConfig Arguments", "Arguments related to the ParallelismConfig used for distributed training.", [
        *_typed("int", 1, *[f"parallelism_config_{n}" for n in (
            "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")]),
        Option("parallelism_config_cp_backend", default="torch", choices=("torch",)),
        Option("parallelism_config_cp_comm_strategy", default="allgather"),
        Option("parallelism_config_sp_backend", default="deepspeed", choices=("deepspeed",)),
        Option("parallelism_config_sp_seq_length"), Option("parallelism_config_sp_seq_length_is_variable", "bool", True),
        Option("parallelism_config_sp_attn_implementation", default="sdpa")]),
]


def all_options() -> list[Option]:
    return [option for _, _, options in GROUPS for option in options]
