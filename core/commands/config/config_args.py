"""Accelerate's `accelerate.commands.config.config_args` for acc: the config-file dataclasses `BaseConfig`,
`ClusterConfig` and `SageMakerConfig`, `load_config_from_file`, and where Accelerate keeps its default config
(`hf_cache_home`, `cache_dir`, `default_config_file`, ...). A file `accelerate config` wrote loads here into the
same fields with the same values; one with keys these classes lack is refused with a ValueError naming them.

The fields mirror the top-level keys acc's own reader of Accelerate's files knows (`acc.compat.accelerate_config`,
which turns them into acc's settings; tests hold the two in step). PyYAML is imported only when a YAML file is read
or written. Torch-free.
"""

import json
import os
from dataclasses import dataclass
from enum import Enum
from typing import Any, Optional, Union

from acc.compat.accelerate_constants import (
    SAGEMAKER_PYTHON_VERSION,
    SAGEMAKER_PYTORCH_VERSION,
    SAGEMAKER_TRANSFORMERS_VERSION,
)
from acc.contract.enums import ComputeEnvironment, DistributedType, SageMakerDistributedType
from acc.errors import did_you_mean

hf_cache_home = os.path.expanduser(
    os.environ.get("HF_HOME", os.path.join(os.environ.get("XDG_CACHE_HOME", "~/.cache"), "huggingface"))
)
cache_dir = os.path.join(hf_cache_home, "accelerate")
# Accelerate 1.15 names the same YAML file for both (its JSON default is a name kept from older releases); the
# values are kept as they are, so a script comparing paths sees Accelerate's.
default_json_config_file = os.path.join(cache_dir, "default_config.yaml")
default_yaml_config_file = os.path.join(cache_dir, "default_config.yaml")

# An older setup may have left only the JSON file: it is the default then.
if os.path.isfile(default_yaml_config_file) or not os.path.isfile(default_json_config_file):
    default_config_file = default_yaml_config_file
else:
    default_config_file = default_json_config_file


def import_yaml() -> Any:
    """PyYAML, which acc does not depend on: an ImportError that says how to install it when it is missing."""
    try:
        import yaml
    except ImportError:
        raise ImportError("reading or writing an Accelerate YAML config file needs PyYAML, which is not installed: "
                          "pip install pyyaml (or give a .json config file)") from None
    return yaml


def _read_mapping(path: str, as_json: bool) -> dict[str, Any]:
    with open(path, encoding="utf-8") as f:
        if as_json:
            data = json.load(f)
        else:
            data = import_yaml().safe_load(f)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"The config file at {path} holds a {type(data).__name__}, not a mapping of config keys "
                         "(`key: value` lines, as `accelerate config` writes); fix the file or write it anew")
    return data


def _is_local(data: dict[str, Any]) -> bool:
    return data.get("compute_environment", ComputeEnvironment.LOCAL_MACHINE) == ComputeEnvironment.LOCAL_MACHINE


def load_config_from_file(config_file: Optional[Union[str, os.PathLike]]) -> "ClusterConfig | SageMakerConfig":
    """The config in `config_file` (the default config when None): a `ClusterConfig` for a LOCAL_MACHINE file, a
    `SageMakerConfig` otherwise. A `.json` file is read as JSON, any other as YAML."""
    if config_file is not None:
        config_file = os.fspath(config_file)
        if not os.path.isfile(config_file):
            raise FileNotFoundError(
                f"The config file `{config_file}` given does not exist. Pass the path of an existing file (one "
                "`accelerate config` wrote), or leave --config_file out to use the default one "
                f"({default_config_file})."
            )
    else:
        config_file = default_config_file
        if not os.path.isfile(config_file):
            raise FileNotFoundError(
                f"No config file was given and the default one ({config_file}) does not exist. Write it with "
                "`accelerate config`, or pass --config_file PATH."
            )
    as_json = config_file.endswith(".json")
    config_class = ClusterConfig if _is_local(_read_mapping(config_file, as_json)) else SageMakerConfig
    if as_json:
        return config_class.from_json_file(json_file=config_file)
    return config_class.from_yaml_file(yaml_file=config_file)


def _plain(value: Any) -> Any:
    """`value` ready to serialize: an Enum as its value; a mapping with each value converted, an empty one None."""
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, dict):
        if not value:
            return None
        return {key: _plain(item) for key, item in value.items()}
    return value


def _as_enum(enum_type: type, value: str, field: str) -> Any:
    try:
        return enum_type(value)
    except ValueError:
        valid = [member.value for member in enum_type]
        raise ValueError(f"{field} {value!r} is not one of Accelerate's {enum_type.__name__} values "
                         f"({', '.join(valid)}){did_you_mean(str(value), valid)}; give one of them") from None


@dataclass
class BaseConfig:
    """The keys every Accelerate config file has; string enums become acc's enum members."""

    compute_environment: ComputeEnvironment
    distributed_type: Union[DistributedType, SageMakerDistributedType]
    mixed_precision: str
    use_cpu: bool
    debug: bool

    def to_dict(self) -> dict[str, Any]:
        """The config as plain data (enums as their values), leaving out None and empty mappings. Unlike
        Accelerate's, it does not change the config's own attributes."""
        plain = {key: _plain(value) for key, value in self.__dict__.items()}
        return {key: value for key, value in plain.items() if value is not None}

    @staticmethod
    def process_config(config_dict: dict[str, Any]) -> dict[str, Any]:
        """Fill in `config_dict` (in place, and return it) as Accelerate does: default compute_environment,
        num_processes, mixed_precision, use_cpu, debug and enable_cpu_affinity, and the older `fp16` and
        `dynamo_backend` keys turned into their current form."""
        if "compute_environment" not in config_dict:
            config_dict["compute_environment"] = ComputeEnvironment.LOCAL_MACHINE
        if "distributed_type" not in config_dict:
            raise ValueError("The config has no `distributed_type`; every Accelerate config needs one "
                             f"({', '.join(d.value for d in DistributedType)}), e.g. `distributed_type: 'NO'` for "
                             "one process. Add it, or write the file with `accelerate config`.")
        if "num_processes" not in config_dict and config_dict["distributed_type"] == DistributedType.NO:
            config_dict["num_processes"] = 1
        if "mixed_precision" not in config_dict:
            config_dict["mixed_precision"] = "fp16" if config_dict.get("fp16") else None
        config_dict.pop("fp16", None)
        if "dynamo_backend" in config_dict:
            backend = config_dict.pop("dynamo_backend")
            config_dict["dynamo_config"] = {} if backend == "NO" else {"dynamo_backend": backend}
        config_dict.setdefault("use_cpu", False)
        config_dict.setdefault("debug", False)
        config_dict.setdefault("enable_cpu_affinity", False)
        return config_dict

    @classmethod
    def _from_mapping(cls, config_dict: dict[str, Any], path: str) -> "BaseConfig":
        given = set(config_dict)
        config_dict = cls.process_config(config_dict)
        fields = sorted(cls.__dataclass_fields__)
        if "num_processes" not in given and "num_processes" not in fields:
            # process_config's default for distributed_type NO; a SageMakerConfig has no such key (Accelerate
            # refuses its own SageMaker files with distributed_type 'NO' for it)
            config_dict.pop("num_processes", None)
        extra_keys = sorted(set(config_dict) - set(fields))
        if extra_keys:
            hints = "".join(did_you_mean(str(key), fields) for key in extra_keys)
            raise ValueError(
                f"The config file at {path} had unknown keys ({extra_keys}){hints}. The keys of a {cls.__name__} "
                f"are: {', '.join(fields)}. Remove or rename the unknown keys (a file from a newer Accelerate may "
                "carry keys this version does not read)."
            )
        return cls(**config_dict)

    @classmethod
    def from_json_file(cls, json_file: Optional[str] = None) -> "BaseConfig":
        """The config in a JSON file (Accelerate's default JSON path when None)."""
        json_file = default_json_config_file if json_file is None else os.fspath(json_file)
        return cls._from_mapping(_read_mapping(json_file, as_json=True), json_file)

    def to_json_file(self, json_file: str) -> None:
        """Write the config as JSON (sorted keys, two-space indent), as Accelerate writes it."""
        with open(json_file, "w", encoding="utf-8") as f:
            f.write(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def from_yaml_file(cls, yaml_file: Optional[str] = None) -> "BaseConfig":
        """The config in a YAML file (Accelerate's default config when None)."""
        yaml_file = default_yaml_config_file if yaml_file is None else os.fspath(yaml_file)
        return cls._from_mapping(_read_mapping(yaml_file, as_json=False), yaml_file)

    def to_yaml_file(self, yaml_file: str) -> None:
        """Write the config as YAML, as Accelerate writes it."""
        yaml = import_yaml()
        with open(yaml_file, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.to_dict(), f)

    def __post_init__(self) -> None:
        if isinstance(self.compute_environment, str):
            self.compute_environment = _as_enum(ComputeEnvironment, self.compute_environment, "compute_environment")
        if isinstance(self.distributed_type, str):
            if self.compute_environment == ComputeEnvironment.AMAZON_SAGEMAKER:
                self.distributed_type = _as_enum(SageMakerDistributedType, self.distributed_type, "distributed_type")
            else:
                self.distributed_type = _as_enum(DistributedType, self.distributed_type, "distributed_type")
        if getattr(self, "dynamo_config", None) is None:
            self.dynamo_config = {}


@dataclass
class ClusterConfig(BaseConfig):
    """A LOCAL_MACHINE config: the processes, machines and plugin settings `accelerate launch` reads."""

    num_processes: int = -1  # -1: given at launch (e.g. by SLURM)
    machine_rank: int = 0
    num_machines: int = 1
    gpu_ids: Optional[str] = None
    main_process_ip: Optional[str] = None
    main_process_port: Optional[int] = None
    rdzv_backend: Optional[str] = "static"
    same_network: Optional[bool] = False
    main_training_function: str = "main"
    enable_cpu_affinity: bool = False

    fp8_config: Optional[dict] = None
    deepspeed_config: Optional[dict] = None
    fsdp_config: Optional[dict] = None
    parallelism_config: Optional[dict] = None
    megatron_lm_config: Optional[dict] = None
    mpirun_config: Optional[dict] = None
    downcast_bf16: bool = False

    # TPU pods (`accelerate tpu-config`)
    tpu_name: Optional[str] = None
    tpu_zone: Optional[str] = None
    tpu_use_cluster: bool = False
    tpu_use_sudo: bool = False
    command_file: Optional[str] = None
    commands: list[str] = None
    tpu_vm: list[str] = None
    tpu_env: list[str] = None

    dynamo_config: Optional[dict] = None

    def __post_init__(self) -> None:
        for name in ("deepspeed_config", "fsdp_config", "megatron_lm_config", "mpirun_config", "fp8_config",
                     "parallelism_config"):
            if getattr(self, name) is None:
                setattr(self, name, {})
        super().__post_init__()


@dataclass
class SageMakerConfig(BaseConfig):
    """An AMAZON_SAGEMAKER config (acc reads and writes it; it has no SageMaker launcher)."""

    ec2_instance_type: str
    iam_role_name: str
    image_uri: Optional[str] = None
    profile: Optional[str] = None
    region: str = "us-east-1"
    num_machines: int = 1
    gpu_ids: str = "all"
    base_job_name: str = "accelerate-sagemaker-1"
    pytorch_version: str = SAGEMAKER_PYTORCH_VERSION
    transformers_version: str = SAGEMAKER_TRANSFORMERS_VERSION
    py_version: str = SAGEMAKER_PYTHON_VERSION
    sagemaker_inputs_file: Optional[str] = None
    sagemaker_metrics_file: Optional[str] = None
    additional_args: Optional[dict] = None
    dynamo_config: Optional[dict] = None
    enable_cpu_affinity: bool = False
