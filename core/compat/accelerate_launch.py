"""`accelerate launch`'s flags, read with Accelerate's meaning, into acc's own settings (so everything after them,
resolution, sources, validation, the dry run, is acc's usual path).

`translate_launch_args`: the arguments of `acc launch` before the script. Every one of `accelerate launch`'s options
is known here (underscore or dash spelling, as Accelerate accepts both): it becomes acc's flag, or is accepted
because it asks for what acc does anyway, or is an error that names it and says what acc offers. `fsdp_settings`
reads Accelerate's FSDP options (flags, config-file keys, `FullyShardedDataParallelPlugin` fields). Accelerate's
config files are `acc.compat.accelerate_config`. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from acc.errors import ConfigError

# ---------------------------------------------------------------------------------------------- launch flags


@dataclass(frozen=True)
class Flag:
    """How acc reads one `accelerate launch` option.

    kind: alias (acc's flag `target`, same meaning), backend (a bool choosing backend `target`), processes
    (--num_processes: the total), tee (--tee with Accelerate's value), noop (accepted, no effect: `why`),
    accept (accepted when its value is one of `ok`, which is what acc does; otherwise an error offering `offer`),
    fsdp (one of the fsdp_* options, combined into acc's fsdp settings), unsupported (an error offering `offer`).
    """

    kind: str
    value: bool = True  # takes a value
    target: str = ""
    owner: str = ""  # the plugin that declares `target` (alias of a backend's own setting)
    ok: tuple[str, ...] = ()
    offer: str = ""
    why: str = ""


def _alias(target: str, value: bool = True, owner: str = "") -> Flag:
    return Flag("alias", value, target, owner)


def _no(offer: str, value: bool = True) -> Flag:
    return Flag("unsupported", value, offer=offer)


def _only(ok: tuple[str, ...], offer: str) -> Flag:
    return Flag("accept", True, ok=ok, offer=offer)


MULTI_MACHINE = ("acc starts every machine's workers with torch's elastic agent: run `acc launch` on each machine "
                  "with --num_machines, --machine_rank and --main_process_ip")
DYNAMO = ("acc compiles prepared models with --dynamo_backend BACKEND and torch.compile's defaults; for its other "
           "options pass Accelerator(dynamo_plugin=TorchDynamoPlugin(...)) in the script")
MEGATRON = "acc has no Megatron-LM backend; its sharding backends are fsdp (--use_fsdp) and deepspeed (--use_deepspeed)"
PARALLELISM = ("acc takes the mesh sizes (--parallelism_config_*_size, and the config file's parallelism_config "
               "sizes) and runs context parallelism with torch's backend and its default allgather rotation; for "
               "alltoall give the script's ParallelismConfig(cp_handler=TorchContextParallelConfig(cp_comm_strategy="
               "'alltoall')) or set PARALLELISM_CONFIG_CP_COMM_STRATEGY=alltoall; no backend drives sequence "
               "parallelism (sp) yet")
FP8 = "acc's mixed precision is no, fp16 or bf16 (--mixed_precision); there is no fp8 yet"
SAGEMAKER = "acc has no SageMaker launcher: run `acc launch` on the instances"
TPU_POD = "acc has no TPU-pod launcher: run `acc launch --tpu` on each TPU host"
_DS = "deepspeed"
_FSDP = "fsdp"

FLAGS: dict[str, Flag] = {
    "config_file": _alias("--config-file"),
    "quiet": Flag("noop", False, why="acc's failure report already shows only the failing rank's own traceback"),
    "cpu": _alias("--cpu", False),
    "multi_gpu": Flag("backend", False, "ddp"),
    "tpu": Flag("backend", False, "xla"),
    "mixed_precision": _alias("--mixed-precision"),
    "num_processes": Flag("processes"),
    "num_machines": _alias("--num-machines"),
    "num_cpu_threads_per_process": _no("set OMP_NUM_THREADS=N in the environment: workers keep it (without it, acc "
                                       "gives each of a machine's N processes cores/N threads)"),
    "enable_cpu_affinity": _no("acc sets no CPU affinity; use numactl or taskset around `acc launch`", False),
    "dynamo_backend": _alias("--dynamo-backend"),
    "dynamo_mode": _no(DYNAMO),
    "dynamo_use_fullgraph": _no(DYNAMO, False),
    "dynamo_use_dynamic": _no(DYNAMO, False),
    "dynamo_use_regional_compilation": _no(DYNAMO, False),
    "use_deepspeed": Flag("backend", False, "deepspeed"),
    "use_fsdp": Flag("backend", False, "fsdp"),
    "use_parallelism_config": Flag("noop", False, why="acc builds the ParallelismConfig from the "
                                   "--parallelism_config_*_size flags given"),
    "use_megatron_lm": _no(MEGATRON, False),
    "gpu_ids": _only(("all",), "set CUDA_VISIBLE_DEVICES=0,1 in the environment; acc runs on the visible devices"),
    "same_network": Flag("noop", False, why="acc's machines always meet at --main_process_ip:--main_process_port"),
    "machine_rank": _alias("--machine-rank"),
    "main_process_ip": _alias("--main-process-ip"),
    "main_process_port": _alias("--main-process-port"),
    "tee": Flag("tee"),
    "log_dir": _alias("--log-dir"),
    "role": _no("acc's elastic workers have the role 'worker'; there is no setting for it"),
    "rdzv_backend": _alias("--rdzv-backend"),
    "rdzv_conf": _no("acc sets the rendezvous itself (--rdzv_backend, --main_process_ip, --main_process_port)"),
    "max_restarts": _alias("--max-restarts"),
    "monitor_interval": _alias("--monitor-interval"),
    "module": _alias("--module", False),
    "no_python": _alias("--no-python", False),
    "tpu_cluster": _no(TPU_POD, False),
    "no_tpu_cluster": Flag("noop", False, why="acc never launches on a TPU-pod cluster"),
    "tpu_use_sudo": _no(TPU_POD, False),
    "vm": _no(TPU_POD),
    "env": _no(TPU_POD + "; set environment variables for the workers in the launching shell"),
    "main_training_function": _only(("main",), "acc runs the script as __main__ (as `python SCRIPT` would) on every "
                                    "backend; call your function from `if __name__ == '__main__':`"),
    "downcast_bf16": _no("acc's xla backend has no bf16 downcast option yet", False),
    "deepspeed_config_file": _alias("--deepspeed-config", owner=_DS),
    "zero_stage": _alias("--zero-stage", owner=_DS),
    "offload_optimizer_device": _alias("--offload-optimizer", owner=_DS),
    "offload_param_device": _alias("--offload-params", owner=_DS),
    "offload_optimizer_nvme_path": _only(("none",), "acc offloads ZeRO state to the CPU only (--offload_optimizer_"
                                         "device cpu), not to NVMe"),
    "offload_param_nvme_path": _only(("none",), "acc offloads ZeRO-3 parameters to the CPU only (--offload_param_"
                                     "device cpu), not to NVMe"),
    "gradient_accumulation_steps": _alias("--gradient-accumulation-steps"),
    "gradient_clipping": _alias("--gradient-clipping", owner=_DS),
    "zero3_init_flag": _only(("false",), "acc does not build the model under deepspeed.zero.Init; every process "
                             "builds it and ZeRO-3 partitions it in prepare()"),
    "zero3_save_16bit_model": _only(("true", "false"), ""),
    "deepspeed_hostfile": _no(MULTI_MACHINE),
    "deepspeed_exclusion_filter": _no(MULTI_MACHINE),
    "deepspeed_inclusion_filter": _no(MULTI_MACHINE),
    "deepspeed_multinode_launcher": _only(("standard",), MULTI_MACHINE + " (Accelerate's 'standard' launcher)"),
    "deepspeed_moe_layer_cls_names": _no("acc has no DeepSpeed MoE layer setting yet"),
    **{name: Flag("fsdp") for name in (
        "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
        "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_forward_prefetch", "fsdp_use_orig_params",
        "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_activation_checkpointing",
        "fsdp_activation_checkpointing_offload")},
    **{f"megatron_lm_{name}": _no(MEGATRON) for name in (
        "tp_degree", "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d",
        "no_save_optim", "optimizer_cpu_offload", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
        "pp_degree", "num_micro_batches", "sequence_parallelism", "recompute_activations", "use_distributed_optimizer",
        "gradient_clipping", "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
        "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings")},
    "fp8_backend": _no(FP8),
    "fp8_use_autocast_during_eval": _no(FP8, False),
    **{f"fp8_{name}": _no(FP8) for name in (
        "margin", "interval", "format", "amax_history_len", "amax_compute_algo", "override_linear_precision",
        "opt_level", "enable_fsdp_float8_all_gather", "pad_inner_dim")},
    "aws_access_key_id": _no(SAGEMAKER),
    "aws_secret_access_key": _no(SAGEMAKER),
    "debug": _no("acc's failure report names the failing rank with its traceback, and its gather checks shapes "
                 "across processes; ACC_DEBUG=1 adds the launcher's own details", False),
    "mpirun_hostfile": _no(MULTI_MACHINE + " (acc does not start workers with mpirun)"),
    **{f"parallelism_config_{name}": _alias(f"--parallelism-config-{name.replace('_', '-')}") for name in (
        "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size")},
    **{f"parallelism_config_{name}": _no(PARALLELISM) for name in (
        "cp_backend", "cp_comm_strategy", "sp_backend", "sp_seq_length", "sp_seq_length_is_variable",
        "sp_attn_implementation")},
}
SHORT: dict[str, str] = {"-t": "tee", "-q": "quiet"}  # Accelerate's short options that acc does not have itself

# the acc flags this translation may emit with a value (so whoever scans the result knows they take one)
EMITTED_VALUE_FLAGS = frozenset(
    [f.target for f in FLAGS.values() if f.kind == "alias" and f.value] + ["--backend", "--nproc", "--fsdp-wrap",
                                                                          "--fsdp-strategy"])
_TEE_VALUE = re.compile(r"^\d$|^\d+:\d(,\d+:\d)*$")
_BACKEND_FLAG = {"deepspeed": "--use_deepspeed", "fsdp": "--use_fsdp", "ddp": "--multi_gpu", "xla": "--tpu"}


@dataclass
class LaunchTranslation:
    """`acc launch`'s arguments with Accelerate's spellings turned into acc's.

    `args` is what click parses. `typed` maps each acc option in it to the spelling the user typed (the dry run
    shows that as the source); `owners` the options that belong to a backend's settings. `total_processes` is
    --num_processes (the total over all machines), turned into --nproc once num_machines is known."""

    args: list[str]
    typed: dict[str, str] = field(default_factory=dict)
    owners: dict[str, str] = field(default_factory=dict)
    values: dict[str, str] = field(default_factory=dict)  # acc option -> its value (before click parses)
    total_processes: int | None = None
    total_flag: str = ""
    backend_flag: str = ""  # the Accelerate flag that chose the backend (--multi_gpu, ...)
    notes: list[str] = field(default_factory=list)
    n_options: int = 0  # args[:n_options] are options, the rest the script and its arguments
    nproc: tuple[int, str] | None = None  # (per machine, source) when Accelerate's meaning decided it


def canonical(option: str) -> str:
    """Accelerate's name of an option: `--num-processes` and `--num_processes` are both `num_processes`."""
    return option[2:].replace("-", "_")


def translate_launch_args(args: list[str], value_flags: set[str] | frozenset[str],
                          known: set[str] | frozenset[str]) -> LaunchTranslation:
    """Rewrite the options before the script; the script and its arguments are kept unchanged.

    `value_flags` are acc's options that take a value; `known` every option acc's command has (an underscore
    spelling of one of them is rewritten to it; other unknown options are left for click to refuse).
    Raises ConfigError for an Accelerate option acc does not offer, naming it and what acc offers instead.
    """
    out: list[str] = []
    tr = LaunchTranslation(out)
    backends: list[tuple[str, str]] = []  # (backend, typed flag)
    fsdp: dict[str, tuple[str, str]] = {}
    value_flags = set(value_flags) | EMITTED_VALUE_FLAGS
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        name, eq, inline = arg.partition("=")

        def take(flag_name: str = name) -> str:
            nonlocal i
            if eq:
                return inline
            if i + 1 >= len(args):
                raise ConfigError(f"flag {flag_name} needs a value")
            i += 1
            return args[i]

        key = canonical(name) if name.startswith("--") else SHORT.get(name)
        spec = FLAGS.get(key) if key else None
        dashed = "--" + key.replace("_", "-") if key and name.startswith("--") else name
        if key == "main_process_port" and "_" in name and \
                (inline if eq else (args[i + 1] if i + 1 < len(args) else "")) == "0":
            take()  # Accelerate's --main_process_port 0: a free port on one machine, what acc picks without the flag
            # (acc's own --main-process-port takes 1..65535)
            tr.notes.append(f"{name} 0: acc picks a free port (its default on one machine)")
            i += 1
            continue
        if spec is None or (dashed in known and spec.kind not in ("tee", "processes")):
            # acc's own option (or its underscore spelling); anything else is left for click to refuse
            option = dashed if dashed in known else name
            if spec is not None and spec.kind == "alias":
                option = spec.target
            tr.typed.setdefault(option, name)
            if option in value_flags and not eq:
                out.append(option)
                value = take()
                out.append(value)
            else:
                out.append(option + (eq + inline if eq else ""))
                value = inline
            if option in value_flags:
                tr.values[option] = value
                if option == "--backend":
                    backends.append((value, name))
            i += 1
            continue
        kind = spec.kind
        if kind == "alias":
            tr.typed[spec.target] = name
            if spec.owner:
                tr.owners[spec.target] = spec.owner
            if spec.value:
                value = take()
                out += [spec.target, value]
                tr.values[spec.target] = value
            elif eq:
                raise ConfigError(f"flag {name} takes no value (got {arg!r})")
            else:
                out.append(spec.target)
        elif kind == "backend":
            if eq:
                raise ConfigError(f"flag {name} takes no value (got {arg!r})")
            backends.append((spec.target, name))
            tr.backend_flag = tr.backend_flag or name
        elif kind == "processes":
            raw = take()
            try:
                total = int(raw)
                if total < 1:
                    raise ValueError
            except ValueError:
                raise ConfigError(f"flag {name}: expected an integer >= 1 (the total number of processes over all "
                                  f"machines, as in Accelerate), got {raw!r}") from None
            tr.total_processes, tr.total_flag = total, name
        elif kind == "tee":
            value = inline if eq else (args[i + 1] if i + 1 < len(args) and _TEE_VALUE.match(args[i + 1]) else None)
            if value is not None and not eq:
                i += 1
            if value in (None, "3"):
                out.append("--tee")
            elif value == "0":
                out.append("--no-tee")
            else:
                raise ConfigError(f"flag {name} {value}: acc's --tee shows both output streams of every rank on the "
                                  "console; use --tee 3 (or --tee), or --tee 0 for none")
            tr.typed["--tee" if value != "0" else "--no-tee"] = name
        elif kind == "noop":
            if spec.value:
                take()
        elif kind == "accept":
            value = take()
            if set(spec.ok) <= {"true", "false"} and value.strip().lower() in ("1", "0", "yes", "no"):
                value = str(as_bool(value, name)).lower()  # Accelerate reads these with str_to_bool
            if value.strip().lower() not in spec.ok:
                if not spec.offer:
                    raise ConfigError(f"flag {name}: expected {' or '.join(spec.ok)}, got {value!r}")
                raise ConfigError(f"Accelerate's {name} {value} is not supported by acc launch yet: {spec.offer} "
                                  f"(accepted: {name} {' or '.join(spec.ok)}, which is what acc does anyway)")
            if key == "zero3_save_16bit_model" and value.strip().lower() == "false":
                tr.notes.append(f"{name} false: acc's save_model gathers the full ZeRO-3 weights anyway")
        elif kind == "fsdp":
            fsdp[key] = (take(), name)
        else:  # unsupported
            raise ConfigError(f"Accelerate's {name} is not supported by acc launch yet: {spec.offer}")
        i += 1
    chosen = sorted({b for b, _ in backends})
    if len(chosen) > 1:
        given = ", ".join(f"{typed} ({b})" for b, typed in backends)
        raise ConfigError(f"{given} choose different backends; give one (`acc plugins` lists the installed ones)")
    if chosen and "--backend" not in tr.values:
        out[:0] = ["--backend", chosen[0]]
        tr.typed["--backend"] = backends[0][1]
        tr.values["--backend"] = chosen[0]
    if fsdp:
        values, notes = fsdp_settings({k: (v, f"flag {typed}") for k, (v, typed) in fsdp.items()})
        tr.notes += notes
        for setting, (value, where) in values.items():
            option = "--" + setting.replace("_", "-")
            if isinstance(value, bool):
                option = option if value else "--no-" + option[2:]
                out.append(option)
            else:
                out += [option, value]
                tr.values[option] = value
            tr.typed[option] = where[len("flag "):]
            tr.owners[option] = _FSDP
    if tr.total_processes is not None and "--nproc" in tr.values:
        raise ConfigError(f"{tr.total_flag} (the total over all machines, Accelerate's) and {tr.typed['--nproc']} "
                          "(processes per machine, acc's) were both given; give one")
    tr.args = out + list(args[i:])
    tr.n_options = len(out)
    return tr


def backend_hint(owner: str) -> str:
    """How to choose the backend that declares a setting: '--use_deepspeed (or --backend deepspeed)'."""
    flag = _BACKEND_FLAG.get(owner)
    return f"{flag} (or --backend {owner})" if flag else f"--backend {owner}"


def per_machine(total: int, machines: int, given: str, machines_from: str) -> int:
    """Accelerate's --num_processes is the total over all machines; acc's nproc is per machine."""
    if total % machines:
        raise ConfigError(
            f"{given}: {total} processes is the total over all machines (Accelerate's meaning), which does not divide "
            f"evenly over num_machines = {machines} (from {machines_from}); give a multiple of {machines}, or --nproc "
            "for the processes on each machine"
        )
    return total // machines


# ---------------------------------------------------------------------------------------------- fsdp options

_STRATEGIES = {"FULL_SHARD": "full_shard", "SHARD_GRAD_OP": "shard_grad_op", "NO_SHARD": None,
               "HYBRID_SHARD": "hybrid_shard", "HYBRID_SHARD_ZERO2": None}
_STRATEGY_ORDER = list(_STRATEGIES)  # Accelerate also accepts 1-5 (torch's ShardingStrategy values)
_FSDP1_ONLY = ("fsdp_backward_prefetch", "fsdp_use_orig_params")
FSDP_KEYS = (
    "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy", "fsdp_reshard_after_forward",
    "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap", "fsdp_backward_prefetch", "fsdp_state_dict_type",
    "fsdp_forward_prefetch", "fsdp_use_orig_params", "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states",
    "fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload", "fsdp_ignored_modules",
)


def as_bool(raw: Any, where: str) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in ("true", "yes", "1"):
        return True
    if text in ("false", "no", "0"):
        return False
    raise ConfigError(f"{where}: expected true or false, got {raw!r}")


def _strategy(raw: Any, where: str) -> str:
    text = str(raw).strip().upper()
    if text.isdigit() and 1 <= int(text) <= len(_STRATEGY_ORDER):
        text = _STRATEGY_ORDER[int(text) - 1]
    if text not in _STRATEGIES:
        raise ConfigError(f"{where}: expected one of {', '.join(_STRATEGIES)}, got {raw!r}")
    mapped = _STRATEGIES[text]
    if mapped is None:
        offer = ("use ddp (--multi_gpu, or distributed_type MULTI_GPU), which replicates instead of sharding"
                 if text == "NO_SHARD" else "acc's hybrid_shard reshards after forward (HYBRID_SHARD)")
        raise ConfigError(f"{where}: {text} is not supported by acc's fsdp backend yet: {offer}")
    return mapped


def fsdp_settings(given: dict[str, tuple[Any, str]]) -> tuple[dict[str, tuple[Any, str]], list[str]]:
    """Accelerate's fsdp_* options -> acc's fsdp settings (fsdp_strategy, fsdp_wrap, fsdp_cpu_offload,
    fsdp_from_rank0).

    `given` maps each option to (value, where it was given). Returns {setting: (value, where)} and notes.
    Options acc cannot honour are errors; those FSDP2 has no use for (acc's fsdp backend runs FSDP2, like
    Accelerate's fsdp_version 2) are accepted with a note, as Accelerate's own FSDP2 conversion drops them.
    """
    out: dict[str, tuple[Any, str]] = {}
    notes: list[str] = []

    def off_only(key: str, offer: str) -> None:
        if key in given and given[key][0] is not None and as_bool(given[key][0], given[key][1]):
            raise ConfigError(f"{given[key][1]}: {key} true is not supported by acc's fsdp backend yet: {offer}")

    if "fsdp_version" in given:
        raw, where = given["fsdp_version"]
        if str(raw).strip() not in ("1", "2"):
            raise ConfigError(f"{where}: expected fsdp_version 1 or 2, got {raw!r}")
        if str(raw).strip() == "1":
            notes.append(f"{where}: fsdp_version 1: acc's fsdp backend runs FSDP2 (fully_shard); the options are read "
                         "as Accelerate's to-fsdp2 converts them")
    strategy = None
    if given.get("fsdp_sharding_strategy", (None,))[0] is not None:
        raw, where = given["fsdp_sharding_strategy"]
        strategy = (_strategy(raw, where), where)
    if given.get("fsdp_reshard_after_forward", (None,))[0] is not None:
        raw, where = given["fsdp_reshard_after_forward"]
        text = str(raw).strip().lower()
        if isinstance(raw, bool) or text in ("true", "false", "yes", "no"):
            reshard = as_bool(raw, where)
            mapped = "full_shard" if reshard else "shard_grad_op"
            if strategy is not None and strategy[0] == "hybrid_shard":
                if not reshard:
                    raise ConfigError(f"{where}: reshard_after_forward false with {strategy[1]} HYBRID_SHARD is not "
                                      "supported by acc's fsdp backend yet (its hybrid_shard reshards after forward)")
                mapped = "hybrid_shard"
        else:
            mapped = _strategy(raw, where)
        if strategy is not None and strategy[0] != mapped:
            raise ConfigError(f"{strategy[1]} ({strategy[0]}) and {where} ({raw}) contradict each other; give one")
        strategy = (mapped, strategy[1] + ", " + where if strategy else where)
    if strategy is not None:
        out["fsdp_strategy"] = strategy
    if given.get("fsdp_offload_params", (None,))[0] is not None:
        raw, where = given["fsdp_offload_params"]
        out["fsdp_cpu_offload"] = (as_bool(raw, where), where)
    policy = given.get("fsdp_auto_wrap_policy", (None, ""))
    classes = given.get("fsdp_transformer_layer_cls_to_wrap", (None, ""))
    size = given.get("fsdp_min_num_params", (None, ""))
    name = str(policy[0]).strip().upper() if policy[0] is not None else None
    if name is not None and name not in ("TRANSFORMER_BASED_WRAP", "SIZE_BASED_WRAP", "NO_WRAP"):
        raise ConfigError(f"{policy[1]}: expected TRANSFORMER_BASED_WRAP, SIZE_BASED_WRAP or NO_WRAP, got {policy[0]!r}")
    if classes[0] is not None and name != "TRANSFORMER_BASED_WRAP":
        raise ConfigError(f"{classes[1]}: the classes to wrap are used with fsdp_auto_wrap_policy TRANSFORMER_BASED_WRAP "
                          "only (Accelerate ignores them otherwise); give that policy too")
    if size[0] is not None and name != "SIZE_BASED_WRAP":
        raise ConfigError(f"{size[1]}: fsdp_min_num_params is used with fsdp_auto_wrap_policy SIZE_BASED_WRAP only "
                          "(Accelerate ignores it otherwise); give that policy too")
    if name == "TRANSFORMER_BASED_WRAP":
        names = [c.strip() for c in str(classes[0] or "").split(",") if c.strip()]
        # without classes Accelerate wraps the classes the model's _no_split_modules names; so does acc, at prepare
        out["fsdp_wrap"] = ("transformer_layer=" + ",".join(names), policy[1] + ", " + classes[1]) if names else \
            ("no_split_modules", policy[1])
    elif name == "SIZE_BASED_WRAP":
        raw = size[0] if size[0] is not None else 100_000_000  # Accelerate's default
        try:
            minimum = int(float(raw))
        except (TypeError, ValueError):
            raise ConfigError(f"{size[1]}: expected an integer, got {raw!r}") from None
        out["fsdp_wrap"] = (f"min_params={minimum}", policy[1] + (", " + size[1] if size[0] is not None else ""))
    elif name == "NO_WRAP":
        out["fsdp_wrap"] = ("", policy[1])
    off_only("fsdp_forward_prefetch", "FSDP2 has no forward prefetch option (Accelerate refuses it with FSDP2 too)")
    # Accelerate's FSDP2 takes rank 0's weights with cpu_ram_efficient_loading (the others build on the meta device);
    # FSDP1's sync_module_states asked for the same: both are acc's fsdp_from_rank0
    for key in ("fsdp_sync_module_states", "fsdp_cpu_ram_efficient_loading"):
        if given.get(key, (None,))[0] is not None:
            raw, where = given[key]
            wanted = as_bool(raw, where)
            if wanted or "fsdp_from_rank0" not in out:
                out["fsdp_from_rank0"] = (wanted, where)
    for key in ("fsdp_activation_checkpointing", "fsdp_activation_checkpointing_offload"):
        off_only(key, "acc has no activation-checkpointing setting yet; use torch.utils.checkpoint in the model")
    if given.get("fsdp_state_dict_type", (None,))[0] is not None:
        raw, where = given["fsdp_state_dict_type"]
        kind = str(raw).strip().upper()
        if kind in ("FULL_STATE_DICT", "1"):  # torch's StateDictType values: 1 full, 2 local, 3 sharded
            notes.append(f"{where}: fsdp_state_dict_type FULL_STATE_DICT applies to save_fsdp_model and "
                         "save_fsdp_optimizer (what transformers' Trainer calls): one full file, as in Accelerate; "
                         "acc's save_state still writes each process's shard, loadable on any number of processes")
        elif kind not in ("SHARDED_STATE_DICT", "3"):
            raise ConfigError(f"{where}: fsdp_state_dict_type {raw} is not supported by acc's fsdp backend: save_state "
                              "writes each process's shard (SHARDED_STATE_DICT), loadable on any number of processes; "
                              "FULL_STATE_DICT is taken for save_fsdp_model; save_model and `acc merge-weights` "
                              "write the full weights")
    if given.get("fsdp_ignored_modules", (None,))[0] not in (None, "", [], "none", "None"):
        raise ConfigError(f"{given['fsdp_ignored_modules'][1]}: fsdp_ignored_modules is not supported by acc's fsdp "
                          "backend yet")
    for key in _FSDP1_ONLY:
        if key in given and given[key][0] is not None:
            raw, where = given[key]
            if key == "fsdp_backward_prefetch":
                prefetch = ("BACKWARD_PRE", "BACKWARD_POST", "NO_PREFETCH")
                if str(raw).strip().upper() not in prefetch + ("1", "2", "3"):
                    raise ConfigError(f"{where}: expected one of {', '.join(prefetch)}, got {raw!r}")
            else:
                as_bool(raw, where)
            notes.append(f"{given[key][1]}: {key} has no effect: FSDP2, which acc's fsdp backend runs, has no such "
                         "option (Accelerate drops it for FSDP2 too)")
    return out, notes


# ---------------------------------------------------------------------------------------------- config files


