"""Accelerate's spellings, read with Accelerate's meaning: `accelerate launch` flags and `accelerate config` files.

Two translations, both into acc's own settings (so everything after them — resolution, sources, validation,
the dry run — is acc's usual path):

- `translate_launch_args`: the arguments of `acc launch` before the script. Every one of `accelerate launch`'s
  options is known here (underscore or dash spelling, as Accelerate accepts both): it becomes acc's flag, or is
  accepted because it asks for what acc does anyway, or is an error that names it and says what acc offers.
- `read_config`: a YAML (or JSON) file written by `accelerate config` becomes the data of a `ConfigFile`, the
  same shape a TOML file has (kernel settings at the top, a table per plugin). Unknown keys are errors naming
  the key and the file. PyYAML is imported only here, only when such a file is read.

Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from acc.errors import ConfigError, did_you_mean

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


_MULTI_MACHINE = ("acc starts every machine's workers with torch's elastic agent: run `acc launch` on each machine "
                  "with --num_machines, --machine_rank and --main_process_ip")
_DYNAMO = ("acc compiles prepared models with --dynamo_backend BACKEND and torch.compile's defaults; for its other "
           "options pass Accelerator(dynamo_plugin=TorchDynamoPlugin(...)) in the script")
_MEGATRON = "acc has no Megatron-LM backend; its sharding backends are fsdp (--use_fsdp) and deepspeed (--use_deepspeed)"
_PARALLELISM = ("acc has no N-d parallelism config (tensor/context/sequence parallel) yet; it shards data-parallel "
                "with fsdp (--use_fsdp) or deepspeed (--use_deepspeed)")
_FP8 = "acc's mixed precision is no, fp16 or bf16 (--mixed_precision); there is no fp8 yet"
_SAGEMAKER = "acc has no SageMaker launcher: run `acc launch` on the instances"
_TPU_POD = "acc has no TPU-pod launcher: run `acc launch --tpu` on each TPU host"
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
    "dynamo_mode": _no(_DYNAMO),
    "dynamo_use_fullgraph": _no(_DYNAMO, False),
    "dynamo_use_dynamic": _no(_DYNAMO, False),
    "dynamo_use_regional_compilation": _no(_DYNAMO, False),
    "use_deepspeed": Flag("backend", False, "deepspeed"),
    "use_fsdp": Flag("backend", False, "fsdp"),
    "use_parallelism_config": _no(_PARALLELISM, False),
    "use_megatron_lm": _no(_MEGATRON, False),
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
    "tpu_cluster": _no(_TPU_POD, False),
    "no_tpu_cluster": Flag("noop", False, why="acc never launches on a TPU-pod cluster"),
    "tpu_use_sudo": _no(_TPU_POD, False),
    "vm": _no(_TPU_POD),
    "env": _no(_TPU_POD + "; set environment variables for the workers in the launching shell"),
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
    "deepspeed_hostfile": _no(_MULTI_MACHINE),
    "deepspeed_exclusion_filter": _no(_MULTI_MACHINE),
    "deepspeed_inclusion_filter": _no(_MULTI_MACHINE),
    "deepspeed_multinode_launcher": _only(("standard",), _MULTI_MACHINE + " (Accelerate's 'standard' launcher)"),
    "deepspeed_moe_layer_cls_names": _no("acc has no DeepSpeed MoE layer setting yet"),
    **{name: Flag("fsdp") for name in (
        "fsdp_version", "fsdp_offload_params", "fsdp_min_num_params", "fsdp_sharding_strategy",
        "fsdp_reshard_after_forward", "fsdp_auto_wrap_policy", "fsdp_transformer_layer_cls_to_wrap",
        "fsdp_backward_prefetch", "fsdp_state_dict_type", "fsdp_forward_prefetch", "fsdp_use_orig_params",
        "fsdp_cpu_ram_efficient_loading", "fsdp_sync_module_states", "fsdp_activation_checkpointing")},
    **{f"megatron_lm_{name}": _no(_MEGATRON) for name in (
        "tp_degree", "use_custom_fsdp", "no_load_optim", "eod_mask_loss", "overlap_cpu_optimizer_d2h_h2d",
        "no_save_optim", "optimizer_cpu_offload", "use_precision_aware_optimizer", "decoder_last_pipeline_num_layers",
        "pp_degree", "num_micro_batches", "sequence_parallelism", "recompute_activations", "use_distributed_optimizer",
        "gradient_clipping", "recompute_granularity", "recompute_method", "recompute_num_layers", "attention_backend",
        "expert_model_parallel_size", "context_parallel_size", "attention_dropout", "hidden_dropout",
        "attention_softmax_in_fp32", "expert_tensor_parallel_size", "calculate_per_token_loss",
        "use_rotary_position_embeddings")},
    "fp8_backend": _no(_FP8),
    "fp8_use_autocast_during_eval": _no(_FP8, False),
    **{f"fp8_{name}": _no(_FP8) for name in (
        "margin", "interval", "format", "amax_history_len", "amax_compute_algo", "override_linear_precision",
        "opt_level", "enable_fsdp_float8_all_gather", "pad_inner_dim")},
    "aws_access_key_id": _no(_SAGEMAKER),
    "aws_secret_access_key": _no(_SAGEMAKER),
    "debug": _no("acc's failure report names the failing rank with its traceback, and its gather checks shapes "
                 "across processes; ACC_DEBUG=1 adds the launcher's own details", False),
    "mpirun_hostfile": _no(_MULTI_MACHINE + " (acc does not start workers with mpirun)"),
    **{f"parallelism_config_{name}": _no(_PARALLELISM) for name in (
        "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "cp_backend", "cp_comm_strategy", "sp_size",
        "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation")},
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
                value = str(_bool(value, name)).lower()  # Accelerate reads these with str_to_bool
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
    "fsdp_activation_checkpointing", "fsdp_ignored_modules",
)


def _bool(raw: Any, where: str) -> bool:
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
        if key in given and given[key][0] is not None and _bool(given[key][0], given[key][1]):
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
            reshard = _bool(raw, where)
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
        out["fsdp_cpu_offload"] = (_bool(raw, where), where)
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
        if not names:
            raise ConfigError(f"{policy[1]}: TRANSFORMER_BASED_WRAP without fsdp_transformer_layer_cls_to_wrap would "
                              "use the model's _no_split_modules, which acc does not read yet: name the classes "
                              "(e.g. fsdp_transformer_layer_cls_to_wrap: BertLayer)")
        out["fsdp_wrap"] = ("transformer_layer=" + ",".join(names), policy[1] + ", " + classes[1])
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
            wanted = _bool(raw, where)
            if wanted or "fsdp_from_rank0" not in out:
                out["fsdp_from_rank0"] = (wanted, where)
    off_only("fsdp_activation_checkpointing", "acc has no activation-checkpointing setting yet; use "
             "torch.utils.checkpoint in the model")
    if given.get("fsdp_state_dict_type", (None,))[0] is not None:
        raw, where = given["fsdp_state_dict_type"]
        if str(raw).strip().upper() not in ("SHARDED_STATE_DICT", "3"):  # 3: torch's StateDictType value
            raise ConfigError(f"{where}: fsdp_state_dict_type {raw} is not supported by acc's fsdp backend: save_state "
                              "writes each process's shard (SHARDED_STATE_DICT), loadable on any number of processes; "
                              "save_model and `acc merge-weights` write the full weights")
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
                _bool(raw, where)
            notes.append(f"{given[key][1]}: {key} has no effect: FSDP2, which acc's fsdp backend runs, has no such "
                         "option (Accelerate drops it for FSDP2 too)")
    return out, notes


# ---------------------------------------------------------------------------------------------- config files

# distributed_type -> (backend, cpu); None: not offered
_DISTRIBUTED = {
    "NO": ("cpu", None), "MULTI_CPU": ("ddp", True), "MULTI_GPU": ("ddp", None), "FSDP": ("fsdp", None),
    "DEEPSPEED": ("deepspeed", None), "XLA": ("xla", None), "TPU": ("xla", None),
}
_NOT_OFFERED = {
    "MEGATRON_LM": _MEGATRON,
    **{f"MULTI_{d}": f"acc has no backend for {d} devices yet; its backends: cpu, ddp, fsdp, deepspeed, xla, mps"
       for d in ("NPU", "MLU", "SDAA", "MUSA", "XPU", "HPU", "NEURON")},
}
_TOP_KEYS = (
    "compute_environment", "distributed_type", "mixed_precision", "use_cpu", "debug", "num_processes", "machine_rank",
    "num_machines", "gpu_ids", "main_process_ip", "main_process_port", "rdzv_backend", "same_network",
    "main_training_function", "enable_cpu_affinity", "fp8_config", "deepspeed_config", "fsdp_config",
    "parallelism_config", "megatron_lm_config", "mpirun_config", "downcast_bf16", "tpu_name", "tpu_zone",
    "tpu_use_cluster", "tpu_use_sudo", "command_file", "commands", "tpu_vm", "tpu_env", "dynamo_config",
    "fp16", "dynamo_backend",  # older files; Accelerate converts them
)
_DEEPSPEED_KEYS = (
    "deepspeed_config_file", "zero_stage", "offload_optimizer_device", "offload_param_device",
    "offload_optimizer_nvme_path", "offload_param_nvme_path", "gradient_accumulation_steps", "gradient_clipping",
    "zero3_init_flag", "zero3_save_16bit_model", "deepspeed_hostfile", "deepspeed_exclusion_filter",
    "deepspeed_inclusion_filter", "deepspeed_multinode_launcher", "deepspeed_moe_layer_cls_names",
)
_EMPTY_TABLES = {"fp8_config": _FP8, "parallelism_config": _PARALLELISM, "megatron_lm_config": _MEGATRON,
                 "mpirun_config": _MULTI_MACHINE + " (acc does not start workers with mpirun)"}
_TPU_KEYS = ("tpu_name", "tpu_zone", "command_file", "commands", "tpu_vm", "tpu_env", "tpu_use_cluster", "tpu_use_sudo")


@dataclass
class Converted:
    """An Accelerate config as acc's config data: `data` has TOML's shape; `origin` names, for each acc setting,
    the Accelerate key it came from (for messages); `total_processes` is num_processes (over all machines)."""

    data: dict[str, Any]
    origin: dict[str, str]
    notes: list[str]
    total_processes: int | None = None
    machines: int = 1


def load(path: Path, label: str, text: str) -> dict[str, Any]:
    """The mapping in an Accelerate YAML/JSON config file (PyYAML is imported only here, only for YAML)."""
    if path.suffix.lower() == ".json":
        import json

        try:
            data = json.loads(text)
        except ValueError as exc:
            raise ConfigError(f"{label} {path}: not valid JSON: {exc}") from None
    else:
        try:
            import yaml
        except ImportError:
            raise ConfigError(f"{label} {path} is a YAML file (an Accelerate config); reading it needs PyYAML, which "
                              "is not installed: pip install pyyaml") from None
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            raise ConfigError(f"{label} {path}: not valid YAML: {exc}") from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{label} {path}: expected a mapping of Accelerate's config keys (what `accelerate config` "
                          f"writes), got a {type(data).__name__}")
    return data


def _line(lines: list[str], key: str) -> int | None:
    pattern = re.compile(r"""^\s*["']?%s["']?\s*:""" % re.escape(key))
    for number, line in enumerate(lines, 1):
        if pattern.match(line):
            return number
    return None


def convert(raw: dict[str, Any], path: Path, label: str = "config file", text: str = "") -> Converted:
    """Accelerate's config keys -> acc's settings (top level) and plugin tables ([fsdp], [deepspeed])."""
    lines = text.splitlines()

    def where(key: str) -> str:
        leaf = key.rsplit(".", 1)[-1]
        line = _line(lines, leaf)
        return f"{label} {path}" + (f", line {line}" if line else "")

    def fail(key: str, problem: str) -> ConfigError:
        return ConfigError(f"{where(key)}: key '{key}': {problem}")

    def unknown(key: str, valid: tuple[str, ...]) -> ConfigError:
        return ConfigError(f"{where(key)}: unknown key '{key}'{did_you_mean(key.rsplit('.', 1)[-1], valid)}; "
                           f"this is read as an Accelerate config (`accelerate config` writes it), whose keys are: "
                           f"{', '.join(valid)}")

    for key in raw:
        if key not in _TOP_KEYS:
            if raw.get("compute_environment") == "AMAZON_SAGEMAKER":
                break  # refused below, with the reason
            raise unknown(str(key), _TOP_KEYS)
    top: dict[str, Any] = {}
    tables: dict[str, dict[str, Any]] = {}
    origin: dict[str, str] = {}
    notes: list[str] = []

    def put(setting: str, value: Any, key: str, table: str | None = None) -> None:
        (tables.setdefault(table, {}) if table else top)[setting] = value
        origin[setting] = key

    env = raw.get("compute_environment", "LOCAL_MACHINE")
    if env == "AMAZON_SAGEMAKER":
        raise fail("compute_environment", "AMAZON_SAGEMAKER is not supported: " + _SAGEMAKER)
    if env != "LOCAL_MACHINE":
        raise fail("compute_environment", f"expected LOCAL_MACHINE, got {env!r}")
    kind = raw.get("distributed_type")
    if kind is None:
        raise ConfigError(f"{label} {path}: an Accelerate config needs a distributed_type (NO, MULTI_CPU, MULTI_GPU, "
                          "FSDP, DEEPSPEED, XLA), as `accelerate config` writes")
    kind = str(kind).upper()
    if kind in _NOT_OFFERED:
        raise fail("distributed_type", f"{kind} is not supported: {_NOT_OFFERED[kind]}")
    if kind not in _DISTRIBUTED:
        raise fail("distributed_type", f"expected one of {', '.join(_DISTRIBUTED)}, got {raw['distributed_type']!r}")
    backend, cpu = _DISTRIBUTED[kind]
    put("backend", backend, "distributed_type")
    if cpu:
        put("cpu", True, "distributed_type")
    use_cpu = raw.get("use_cpu")
    if use_cpu is not None:
        if _bool(use_cpu, where("use_cpu")):
            put("cpu", True, "use_cpu")
        elif not cpu:
            put("cpu", False, "use_cpu")
    precision = raw.get("mixed_precision")
    if precision is None and raw.get("fp16"):
        put("mixed_precision", "fp16", "fp16")
    elif precision is not None:
        put("mixed_precision", str(precision).lower(), "mixed_precision")
    machines = raw.get("num_machines")
    if machines is not None:
        put("num_machines", machines, "num_machines")
    for key in ("machine_rank", "main_process_ip"):
        if raw.get(key) is not None:
            put(key, raw[key], key)
    if raw.get("main_process_port") not in (None, 0):  # 0: Accelerate picks a free port, as acc does without one
        put("main_process_port", raw["main_process_port"], "main_process_port")
    total = raw.get("num_processes")
    count = machines if isinstance(machines, int) and not isinstance(machines, bool) and machines >= 1 else 1
    if total is not None and total != -1:  # -1: Accelerate's "given at launch"
        if isinstance(total, bool) or not isinstance(total, int) or total < 1:
            raise fail("num_processes", f"expected an integer >= 1 (the total over all machines), got {total!r}")
        put("nproc", per_machine(total, count, f"{where('num_processes')}: key 'num_processes'",
                                 where("num_machines") if machines is not None else "the default"), "num_processes")
    else:
        total = None
    rdzv = raw.get("rdzv_backend")
    if rdzv is not None and not (rdzv == "static" and count == 1):
        # static is what `accelerate config` writes; on one machine Accelerate falls back to a free port when its
        # 29500 is taken, which is what acc's default (c10d on a free port) does
        put("rdzv_backend", rdzv, "rdzv_backend")
        if rdzv == "static" and "main_process_port" not in top:
            put("main_process_port", 29500, "rdzv_backend")  # Accelerate's default port
    if raw.get("same_network") is not None:
        _bool(raw["same_network"], where("same_network"))  # no effect: acc's machines meet at main_process_ip
    gpu_ids = raw.get("gpu_ids")
    if gpu_ids is not None and str(gpu_ids).strip().lower() != "all":
        raise fail("gpu_ids", f"{gpu_ids!r} is not supported: set CUDA_VISIBLE_DEVICES={gpu_ids} in the environment "
                              "instead (acc runs on the visible devices)")
    function = raw.get("main_training_function")
    if function not in (None, "main") and backend == "xla":
        raise fail("main_training_function", f"{function!r} is not supported: acc runs the script as __main__ on "
                                             "every backend; call your function from `if __name__ == '__main__':`")
    if raw.get("debug") is not None and _bool(raw["debug"], where("debug")):
        raise fail("debug", "true is not supported: " + FLAGS["debug"].offer)
    if raw.get("enable_cpu_affinity") is not None and _bool(raw["enable_cpu_affinity"], where("enable_cpu_affinity")):
        raise fail("enable_cpu_affinity", "true is not supported: " + FLAGS["enable_cpu_affinity"].offer)
    if raw.get("downcast_bf16") not in (None, False, "no", "false"):
        raise fail("downcast_bf16", f"{raw['downcast_bf16']!r} is not supported: " + FLAGS["downcast_bf16"].offer)
    for key in _TPU_KEYS:
        value = raw.get(key)
        if value not in (None, False, "", [], {}):
            raise fail(key, f"{value!r} is not supported: it is read by `accelerate tpu-config` and TPU-pod "
                            f"launches; {_TPU_POD}")
    for key, offer in _EMPTY_TABLES.items():
        if raw.get(key) not in (None, {}):
            raise fail(key, f"is not supported: {offer} (acc reads it only when empty)")
    dynamo = dict(raw.get("dynamo_config") or {})
    if "dynamo_backend" in raw:
        dynamo["dynamo_backend"] = raw["dynamo_backend"]
    if dynamo and not (set(dynamo) <= {"dynamo_backend"} and str(dynamo["dynamo_backend"]).upper() == "NO"):
        raise fail("dynamo_config", f"{dynamo!r} is not supported: {_DYNAMO}")

    deepspeed = raw.get("deepspeed_config") or {}
    if not isinstance(deepspeed, dict):
        raise fail("deepspeed_config", f"expected a mapping, got {deepspeed!r}")
    for key in deepspeed:
        if key not in _DEEPSPEED_KEYS:
            raise unknown(f"deepspeed_config.{key}", _DEEPSPEED_KEYS)
    fsdp = raw.get("fsdp_config") or {}
    if not isinstance(fsdp, dict):
        raise fail("fsdp_config", f"expected a mapping, got {fsdp!r}")
    fsdp = {(k if str(k).startswith("fsdp_") else f"fsdp_{k}"): v for k, v in fsdp.items()}  # Accelerate adds it too
    for key in fsdp:
        if key not in FSDP_KEYS:
            raise unknown(f"fsdp_config.{key}", FSDP_KEYS)
    if deepspeed and backend != "deepspeed":
        notes.append(f"{label} {path}: deepspeed_config is not used: distributed_type is {kind} (Accelerate ignores "
                     "it too)")
    if fsdp and backend != "fsdp":
        notes.append(f"{label} {path}: fsdp_config is not used: distributed_type is {kind} (Accelerate ignores it too)")
    if backend == "deepspeed":
        _deepspeed(deepspeed, put, fail, notes, where)
    if backend == "fsdp":
        values, fsdp_notes = fsdp_settings({k: (v, f"{where(k)}: key 'fsdp_config.{k}'") for k, v in fsdp.items()})
        notes += fsdp_notes
        for setting, (value, _) in values.items():
            keys = [k for k in fsdp if (setting == "fsdp_strategy" and k in ("fsdp_sharding_strategy",
                    "fsdp_reshard_after_forward")) or (setting == "fsdp_wrap" and k in ("fsdp_auto_wrap_policy",
                    "fsdp_transformer_layer_cls_to_wrap", "fsdp_min_num_params")) or (setting == "fsdp_cpu_offload"
                    and k == "fsdp_offload_params")]
            put(setting, value, "fsdp_config." + "+".join(keys), "fsdp")
    data: dict[str, Any] = dict(top)
    data.update(tables)
    return Converted(data, origin, notes, total, count)


def _deepspeed(ds: dict[str, Any], put: Callable, fail: Callable, notes: list[str], where: Callable) -> None:
    def given(key: str) -> Any:
        value = ds.get(key)
        return None if value is None or (isinstance(value, str) and value.strip().lower() == "none"
                                         and key.endswith(("_file", "_path"))) else value

    if given("deepspeed_config_file") is not None:
        put("deepspeed_config", str(ds["deepspeed_config_file"]), "deepspeed_config.deepspeed_config_file", "deepspeed")
    if given("zero_stage") is not None:
        put("zero_stage", ds["zero_stage"], "deepspeed_config.zero_stage", "deepspeed")
    for key, setting in (("offload_optimizer_device", "offload_optimizer"), ("offload_param_device", "offload_params")):
        if given(key) is not None:
            put(setting, str(ds[key]).lower(), f"deepspeed_config.{key}", "deepspeed")
    if given("gradient_accumulation_steps") is not None:
        put("gradient_accumulation_steps", ds["gradient_accumulation_steps"],
            "deepspeed_config.gradient_accumulation_steps")
    if given("gradient_clipping") is not None:
        value = ds["gradient_clipping"]
        put("gradient_clipping", float(value) if isinstance(value, int) and not isinstance(value, bool) else value,
            "deepspeed_config.gradient_clipping", "deepspeed")
    for key in ("offload_optimizer_nvme_path", "offload_param_nvme_path"):
        if given(key) is not None:
            raise fail(f"deepspeed_config.{key}", f"{ds[key]!r} is not supported: {FLAGS[key].offer}")
    if ds.get("zero3_init_flag") is not None and _bool(ds["zero3_init_flag"], where("zero3_init_flag")):
        raise fail("deepspeed_config.zero3_init_flag", "true is not supported: " + FLAGS["zero3_init_flag"].offer)
    if ds.get("zero3_save_16bit_model") is not None and not _bool(ds["zero3_save_16bit_model"],
                                                                  where("zero3_save_16bit_model")):
        notes.append(f"{where('zero3_save_16bit_model')}: zero3_save_16bit_model false: acc's save_model gathers the "
                     "full ZeRO-3 weights anyway")
    for key in ("deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
                "deepspeed_moe_layer_cls_names"):
        if given(key) not in (None, ""):
            raise fail(f"deepspeed_config.{key}", f"{ds[key]!r} is not supported: {FLAGS[key].offer}")
    launcher = ds.get("deepspeed_multinode_launcher")
    if launcher not in (None, "standard"):
        raise fail("deepspeed_config.deepspeed_multinode_launcher", f"{launcher!r} is not supported: {_MULTI_MACHINE}")


def read_config(path: Path, label: str, text: str) -> Converted:
    """Read and convert an Accelerate config file."""
    return convert(load(path, label, text), path, label, text)
