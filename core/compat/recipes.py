"""Accelerate's configuration objects for what acc runs only through other libraries: fp8 training recipes
(`AORecipeKwargs` for torchao, `TERecipeKwargs` for TransformerEngine, `MSAMPRecipeKwargs`, the deprecated
`FP8RecipeKwargs`), bitsandbytes quantization (`BnbQuantizationConfig`), and Megatron-LM's names, which acc has no
backend for (building them is an error that says so). Field names, defaults and `ACCELERATE_FP8_*` variables are
Accelerate's. The public path is `acc.utils` / `acc.utils.dataclasses`.

Torch-free to import: dtypes and the libraries are imported when an object is built.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from typing import Any, Callable

from acc.contract.enums import CustomDtype
from acc.contract.kwargs import KwargsHandler
from acc.errors import AccError

FP8_ENV = "ACCELERATE_FP8_"
FP8_FORMATS = ("HYBRID", "E4M3", "E5M2")
AMAX_ALGORITHMS = ("max", "most_recent")
MSAMP_LEVELS = ("O1", "O2")


def _flag(name: str, default: bool = False) -> bool:
    from acc.compat.environment import parse_flag_from_env

    return parse_flag_from_env(FP8_ENV + name, default=default)


def _available(name: str) -> bool:
    """Whether the package `name` is installed (found, not imported)."""
    import importlib.util

    return importlib.util.find_spec(name) is not None


@dataclass
class AORecipeKwargs(KwargsHandler):
    """fp8 through torchao's Float8Linear: `config` (a `torchao.float8.Float8LinearConfig`, built from
    `pad_inner_dim` and `enable_fsdp_float8_all_gather` when not given) and a `module_filter_func`."""

    config: Any = None
    module_filter_func: Callable | None = None
    pad_inner_dim: bool | None = None
    enable_fsdp_float8_all_gather: bool | None = None

    def __post_init__(self) -> None:
        if not _available("torchao"):
            raise ImportError("AORecipeKwargs needs torchao (pip install torchao), which is not installed")
        if self.config is None:
            from torchao.float8 import Float8LinearConfig

            if self.pad_inner_dim is None:
                self.pad_inner_dim = _flag("PAD_INNER_DIM", True)
            if self.enable_fsdp_float8_all_gather is None:
                self.enable_fsdp_float8_all_gather = _flag("ENABLE_FSDP_FLOAT8_ALL_GATHER", True)
            self.config = Float8LinearConfig(pad_inner_dim=self.pad_inner_dim,
                                             enable_fsdp_float8_all_gather=self.enable_fsdp_float8_all_gather)


@dataclass
class MSAMPRecipeKwargs(KwargsHandler):
    """fp8 through MS-AMP: its `opt_level` ("O1" or "O2", default O2 or ACCELERATE_FP8_OPT_LEVEL)."""

    opt_level: str | None = None

    def __post_init__(self) -> None:
        if self.opt_level is None:
            self.opt_level = os.environ.get(FP8_ENV + "OPT_LEVEL", "O2")
        if self.opt_level not in MSAMP_LEVELS:
            raise ValueError(f"`opt_level` must be one of {' or '.join(MSAMP_LEVELS)}, got {self.opt_level!r}")


@dataclass
class TERecipeKwargs(KwargsHandler):
    """fp8 through NVIDIA TransformerEngine's DelayedScaling recipe (its fields; ACCELERATE_FP8_* variables give the
    defaults)."""

    use_autocast_during_eval: bool | None = None
    margin: int | None = None
    interval: int | None = None
    fp8_format: str | None = None
    amax_history_len: int | None = None
    amax_compute_algo: str | None = None
    override_linear_precision: tuple[bool, bool, bool] | None = None
    use_mxfp8_block_scaling: bool | None = None

    def __post_init__(self) -> None:
        if not _available("transformer_engine"):
            raise ImportError("TERecipeKwargs needs NVIDIA TransformerEngine (transformer_engine), which is not "
                              "installed; it runs on CUDA devices with fp8 (Hopper and newer)")
        self._read_te_environment()

    def _read_te_environment(self) -> None:
        if self.use_autocast_during_eval is None:
            self.use_autocast_during_eval = _flag("USE_AUTOCAST_DURING_EVAL")
        if self.margin is None:
            self.margin = int(os.environ.get(FP8_ENV + "MARGIN", 0))
        if self.interval is None:
            self.interval = int(os.environ.get(FP8_ENV + "INTERVAL", 1))
        self.fp8_format = (self.fp8_format or os.environ.get(FP8_ENV + "FORMAT", "HYBRID")).upper()
        if self.fp8_format not in FP8_FORMATS:
            raise ValueError(f"`fp8_format` must be one of {' or '.join(FP8_FORMATS)}, got {self.fp8_format!r}")
        self.amax_compute_algo = (self.amax_compute_algo or os.environ.get(FP8_ENV + "AMAX_COMPUTE_ALGO",
                                                                           "most_recent")).lower()
        if self.amax_compute_algo not in AMAX_ALGORITHMS:
            raise ValueError(f"`amax_compute_algo` must be one of {' or '.join(AMAX_ALGORITHMS)}, got "
                             f"{self.amax_compute_algo!r}")
        if self.amax_history_len is None:
            self.amax_history_len = int(os.environ.get(FP8_ENV + "AMAX_HISTORY_LEN", 1024))
        if self.override_linear_precision is None:
            self.override_linear_precision = (_flag("OVERRIDE_FPROP"), _flag("OVERRIDE_DGRAD"), _flag("OVERRIDE_WGRAD"))
        if self.use_mxfp8_block_scaling is None:
            self.use_mxfp8_block_scaling = _flag("USE_MXFP8_BLOCK_SCALING")


@dataclass
class FP8RecipeKwargs(TERecipeKwargs, MSAMPRecipeKwargs):
    """Deprecated in Accelerate (use TERecipeKwargs or MSAMPRecipeKwargs): `backend` "TE" or "MSAMP"."""

    backend: str | None = None

    def __post_init__(self) -> None:
        warnings.warn("FP8RecipeKwargs is deprecated (as in Accelerate, which removes it in v2.0): use "
                      "TERecipeKwargs or MSAMPRecipeKwargs", FutureWarning, stacklevel=3)
        default = "msamp" if _available("msamp") else "te"
        self.backend = (self.backend or os.environ.get(FP8_ENV + "BACKEND", default)).upper()
        if self.backend not in ("MSAMP", "TE"):
            raise ValueError(f"`backend` must be 'MSAMP' or 'TE' (TransformerEngine) to use FP8RecipeKwargs, got "
                             f"{self.backend!r}")
        if self.backend == "TE":
            TERecipeKwargs.__post_init__(self)
        else:
            MSAMPRecipeKwargs.__post_init__(self)


_DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


def _dtype(value: Any, what: str) -> Any:
    import torch

    if isinstance(value, str):
        if value not in _DTYPES:
            raise ValueError(f"{what} must be in {list(_DTYPES)} but found {value}")
        return getattr(torch, _DTYPES[value])
    if value is not None and not isinstance(value, torch.dtype):
        raise ValueError(f"{what} must be a string or a torch.dtype")
    return value


@dataclass
class BnbQuantizationConfig:
    """Quantizing a model with bitsandbytes (8-bit or 4-bit linear layers), with Accelerate's fields and checks."""

    load_in_8bit: bool = False
    llm_int8_threshold: float = 6.0
    load_in_4bit: bool = False
    bnb_4bit_quant_type: str = "fp4"
    bnb_4bit_use_double_quant: bool = False
    bnb_4bit_compute_dtype: Any = "fp16"
    torch_dtype: Any = None
    skip_modules: list[str] | None = None
    keep_in_fp32_modules: list[str] | None = None
    target_dtype: Any = field(default=None, init=False)

    def __post_init__(self) -> None:
        for name in ("load_in_8bit", "load_in_4bit", "bnb_4bit_use_double_quant"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a boolean")
        if self.load_in_4bit == self.load_in_8bit:
            raise ValueError("load_in_4bit and load_in_8bit can't be both " + ("True" if self.load_in_4bit else "False"))
        if not isinstance(self.llm_int8_threshold, (int, float)):
            raise ValueError("llm_int8_threshold must be a float or an int")
        if not isinstance(self.bnb_4bit_quant_type, str):
            raise ValueError("bnb_4bit_quant_type must be a string")
        if self.bnb_4bit_quant_type not in ("fp4", "nf4"):
            raise ValueError(f"bnb_4bit_quant_type must be in ['fp4','nf4'] but found {self.bnb_4bit_quant_type}")
        self.bnb_4bit_compute_dtype = _dtype(self.bnb_4bit_compute_dtype, "bnb_4bit_compute_dtype")
        for name in ("skip_modules", "keep_in_fp32_modules"):
            if getattr(self, name) is not None and not isinstance(getattr(self, name), list):
                raise ValueError(f"{name} must be a list of strings")
        import torch

        self.target_dtype = CustomDtype.INT4 if self.load_in_4bit else torch.int8
        if self.load_in_4bit and self.llm_int8_threshold != 6.0:
            warnings.warn("llm_int8_threshold applies to models loaded in 8 bit only", stacklevel=3)
        self.torch_dtype = _dtype(self.torch_dtype, "torch_dtype")
        if self.load_in_8bit and self.torch_dtype is None:
            self.torch_dtype = torch.float16
        if self.load_in_4bit and self.torch_dtype is None:
            self.torch_dtype = self.bnb_4bit_compute_dtype


_NO_MEGATRON = ("acc has no Megatron-LM backend: shard with fsdp (--backend fsdp) or DeepSpeed ZeRO (--backend "
                "deepspeed), and use ParallelismConfig (acc.parallelism_config) for tensor and context parallelism")


class MegatronLMPlugin:
    """Accelerate's Megatron-LM configuration. acc has no Megatron-LM backend, so building one is an error that
    says what to use instead; the name imports, so a script that only refers to it keeps working."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise AccError(f"MegatronLMPlugin: {_NO_MEGATRON}")


class MegatronLMDummyScheduler:
    """Accelerate's stand-in for Megatron-LM's own scheduler; as `MegatronLMPlugin`, an error when built."""

    def __init__(self, *args: Any, **kwargs: Any):
        raise AccError(f"MegatronLMDummyScheduler: {_NO_MEGATRON}")


@dataclass
class TorchTensorParallelPlugin:
    """Accelerate's older tensor-parallel plugin (`tp_size`, `torch_device_mesh`); `Accelerator` takes
    `parallelism_config=ParallelismConfig(tp_size=...)` instead."""

    tp_size: int = 1
    torch_device_mesh: Any = None


__all__ = ["AORecipeKwargs", "BnbQuantizationConfig", "FP8RecipeKwargs", "MSAMPRecipeKwargs", "MegatronLMDummyScheduler",
           "MegatronLMPlugin", "TERecipeKwargs", "TorchTensorParallelPlugin"]
