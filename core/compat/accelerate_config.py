"""Accelerate's config files, read with Accelerate's meaning: a YAML (or JSON) file written by `accelerate config`
becomes the data of a `ConfigFile` (`read_config`), the same shape a TOML file has (kernel settings at the top, a
table per plugin). Unknown keys are errors naming the key and the file. PyYAML is imported only here, only when such
a file is read. Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from acc.compat.accelerate_launch import (
    DYNAMO,
    FLAGS,
    FP8,
    FSDP_KEYS,
    MEGATRON,
    MULTI_MACHINE,
    PARALLELISM,
    SAGEMAKER,
    TPU_POD,
    as_bool,
    fsdp_settings,
    per_machine,
)
from acc.errors import ConfigError, did_you_mean

# distributed_type -> (backend, cpu); None: not offered
_DISTRIBUTED = {
    "NO": ("cpu", None), "MULTI_CPU": ("ddp", True), "MULTI_GPU": ("ddp", None), "FSDP": ("fsdp", None),
    "DEEPSPEED": ("deepspeed", None), "XLA": ("xla", None), "TPU": ("xla", None),
}


_NOT_OFFERED = {
    "MEGATRON_LM": MEGATRON,
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


_EMPTY_TABLES = {"fp8_config": FP8, "megatron_lm_config": MEGATRON,
                 "mpirun_config": MULTI_MACHINE + " (acc does not start workers with mpirun)"}


_PARALLELISM_KEYS = tuple(f"parallelism_config_{name}" for name in (
    "dp_replicate_size", "dp_shard_size", "tp_size", "cp_size", "sp_size", "cp_backend", "cp_comm_strategy",
    "sp_backend", "sp_seq_length", "sp_seq_length_is_variable", "sp_attn_implementation"))
# the values `accelerate config` writes for options acc has no choice for: the only ones acc runs
_PARALLELISM_DEFAULTS = {"parallelism_config_cp_backend": "torch", "parallelism_config_sp_backend": "deepspeed",
                         "parallelism_config_cp_comm_strategy": "allgather"}


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
        raise fail("compute_environment", "AMAZON_SAGEMAKER is not supported: " + SAGEMAKER)
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
        if as_bool(use_cpu, where("use_cpu")):
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
        as_bool(raw["same_network"], where("same_network"))  # no effect: acc's machines meet at main_process_ip
    gpu_ids = raw.get("gpu_ids")
    if gpu_ids is not None and str(gpu_ids).strip().lower() != "all":
        raise fail("gpu_ids", f"{gpu_ids!r} is not supported: set CUDA_VISIBLE_DEVICES={gpu_ids} in the environment "
                              "instead (acc runs on the visible devices)")
    function = raw.get("main_training_function")
    if function not in (None, "main") and backend == "xla":
        raise fail("main_training_function", f"{function!r} is not supported: acc runs the script as __main__ on "
                                             "every backend; call your function from `if __name__ == '__main__':`")
    if raw.get("debug") is not None and as_bool(raw["debug"], where("debug")):
        raise fail("debug", "true is not supported: " + FLAGS["debug"].offer)
    if raw.get("enable_cpu_affinity") is not None and as_bool(raw["enable_cpu_affinity"], where("enable_cpu_affinity")):
        raise fail("enable_cpu_affinity", "true is not supported: " + FLAGS["enable_cpu_affinity"].offer)
    if raw.get("downcast_bf16") not in (None, False, "no", "false"):
        raise fail("downcast_bf16", f"{raw['downcast_bf16']!r} is not supported: " + FLAGS["downcast_bf16"].offer)
    for key in _TPU_KEYS:
        value = raw.get(key)
        if value not in (None, False, "", [], {}):
            raise fail(key, f"{value!r} is not supported: it is read by `accelerate tpu-config` and TPU-pod "
                            f"launches; {TPU_POD}")
    for key, offer in _EMPTY_TABLES.items():
        if raw.get(key) not in (None, {}):
            raise fail(key, f"is not supported: {offer} (acc reads it only when empty)")
    parallelism = raw.get("parallelism_config") or {}
    if not isinstance(parallelism, dict):
        raise fail("parallelism_config", f"expected a mapping, got {parallelism!r}")
    for key, value in parallelism.items():
        dim = str(key).removeprefix("parallelism_config_").removesuffix("_size")
        if key not in _PARALLELISM_KEYS:
            raise unknown(f"parallelism_config.{key}", _PARALLELISM_KEYS)
        if str(key).endswith("_size"):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise fail(f"parallelism_config.{key}", f"expected an integer >= 1, got {value!r}")
            put(f"mesh_{dim}_size", value, f"parallelism_config.{key}")
        elif value not in (None, "", _PARALLELISM_DEFAULTS.get(key)):
            raise fail(f"parallelism_config.{key}", f"{value!r} is not supported: {PARALLELISM}")
    dynamo = dict(raw.get("dynamo_config") or {})
    if "dynamo_backend" in raw:
        dynamo["dynamo_backend"] = raw["dynamo_backend"]
    if dynamo and not (set(dynamo) <= {"dynamo_backend"} and str(dynamo["dynamo_backend"]).upper() == "NO"):
        raise fail("dynamo_config", f"{dynamo!r} is not supported: {DYNAMO}")

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
    if ds.get("zero3_init_flag") is not None and as_bool(ds["zero3_init_flag"], where("zero3_init_flag")):
        raise fail("deepspeed_config.zero3_init_flag", "true is not supported: " + FLAGS["zero3_init_flag"].offer)
    if ds.get("zero3_save_16bit_model") is not None and not as_bool(ds["zero3_save_16bit_model"],
                                                                  where("zero3_save_16bit_model")):
        notes.append(f"{where('zero3_save_16bit_model')}: zero3_save_16bit_model false: acc's save_model gathers the "
                     "full ZeRO-3 weights anyway")
    for key in ("deepspeed_hostfile", "deepspeed_exclusion_filter", "deepspeed_inclusion_filter",
                "deepspeed_moe_layer_cls_names"):
        if given(key) not in (None, ""):
            raise fail(f"deepspeed_config.{key}", f"{ds[key]!r} is not supported: {FLAGS[key].offer}")
    launcher = ds.get("deepspeed_multinode_launcher")
    if launcher not in (None, "standard"):
        raise fail("deepspeed_config.deepspeed_multinode_launcher", f"{launcher!r} is not supported: {MULTI_MACHINE}")


def read_config(path: Path, label: str, text: str) -> Converted:
    """Read and convert an Accelerate config file."""
    return convert(load(path, label, text), path, label, text)
