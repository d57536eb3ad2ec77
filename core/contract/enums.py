"""The enumerations Accelerate scripts name (`accelerate.utils.LoggerType`, `PrecisionType`, ...), with
Accelerate's members, values and base classes, so comparisons behave as they do there. Torch-free.

`BaseEnum` members print as their value (`str(PrecisionType.FP16) == "fp16"`) and the class answers
`"fp16" in PrecisionType`. The ones Accelerate also derives from `str` (PrecisionType, DynamoBackend,
ComputeEnvironment) compare equal to their value; the others (LoggerType, RNGType,
DDPCommunicationHookType) do not, as in Accelerate.
"""

from __future__ import annotations

import enum


class EnumWithContains(enum.EnumMeta):
    """`value in SomeEnum` is True when `SomeEnum(value)` exists."""

    def __contains__(cls, item: object) -> bool:
        try:
            cls(item)
        except ValueError:
            return False
        return True


class BaseEnum(enum.Enum, metaclass=EnumWithContains):
    """An enum whose members print as their value; `list()` gives every value."""

    def __str__(self) -> str:
        return str(self.value)

    @classmethod
    def list(cls) -> list[str]:
        return [str(member) for member in cls]


class DDPCommunicationHookType(BaseEnum):
    """A DDP communication hook: compress gradients to fp16/bf16 for the all-reduce, or PowerSGD."""

    NO = "no"
    FP16 = "fp16"
    BF16 = "bf16"
    POWER_SGD = "power_sgd"
    BATCHED_POWER_SGD = "batched_power_sgd"


class LoggerType(BaseEnum):
    """Experiment trackers, by name."""

    ALL = "all"
    AIM = "aim"
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    TRACKIO = "trackio"
    COMETML = "comet_ml"
    MLFLOW = "mlflow"
    CLEARML = "clearml"
    DVCLIVE = "dvclive"
    SWANLAB = "swanlab"


class PrecisionType(str, BaseEnum):
    """Mixed-precision modes (acc runs "no", "fp16" and "bf16"; "fp8" is named for compatibility)."""

    NO = "no"
    FP8 = "fp8"
    FP16 = "fp16"
    BF16 = "bf16"


class RNGType(BaseEnum):
    """Random-number generators whose states are synchronised or checkpointed."""

    TORCH = "torch"
    CUDA = "cuda"
    MLU = "mlu"
    SDAA = "sdaa"
    MUSA = "musa"
    NPU = "npu"
    XLA = "xla"
    XPU = "xpu"
    HPU = "hpu"
    NEURON = "neuron"
    GENERATOR = "generator"


class ComputeEnvironment(str, enum.Enum):
    """Where a run is configured to happen."""

    LOCAL_MACHINE = "LOCAL_MACHINE"
    AMAZON_SAGEMAKER = "AMAZON_SAGEMAKER"


class DynamoBackend(str, BaseEnum):
    """`torch.compile` backends, by Accelerate's upper-case names."""

    NO = "NO"
    EAGER = "EAGER"
    AOT_EAGER = "AOT_EAGER"
    INDUCTOR = "INDUCTOR"
    AOT_TS_NVFUSER = "AOT_TS_NVFUSER"
    NVPRIMS_NVFUSER = "NVPRIMS_NVFUSER"
    CUDAGRAPHS = "CUDAGRAPHS"
    OFI = "OFI"
    FX2TRT = "FX2TRT"
    ONNXRT = "ONNXRT"
    TENSORRT = "TENSORRT"
    AOT_TORCHXLA_TRACE_ONCE = "AOT_TORCHXLA_TRACE_ONCE"
    TORCHXLA_TRACE_ONCE = "TORCHXLA_TRACE_ONCE"
    TVM = "TVM"
    HPU_BACKEND = "HPU_BACKEND"
    NEURON = "NEURON"


class SageMakerDistributedType(str, enum.Enum):
    """How a SageMaker job shares the work (Accelerate's names; acc has no SageMaker launcher)."""

    NO = "NO"
    DATA_PARALLEL = "DATA_PARALLEL"
    MODEL_PARALLEL = "MODEL_PARALLEL"


class FP8BackendType(str, enum.Enum):
    """The library an fp8 run goes through."""

    NO = "NO"
    TE = "TE"
    MSAMP = "MSAMP"
    AO = "AO"


class CustomDtype(enum.Enum):
    """Storage types torch has no dtype for (quantized weights), in size estimates."""

    FP8 = "fp8"
    INT4 = "int4"
    INT2 = "int2"


__all__ = ["BaseEnum", "ComputeEnvironment", "CustomDtype", "DDPCommunicationHookType", "DistributedType",
           "DynamoBackend", "EnumWithContains", "FP8BackendType", "LoggerType", "PrecisionType", "RNGType",
           "SageMakerDistributedType"]


class DistributedType(str, enum.Enum):
    """How the processes of a run share the work (Accelerate's names and values).

    Each backend declares its own in `ProcessInfo.distributed_type` (acc_setup); a third-party backend may
    declare a value of its own, which `as_distributed_type` then keeps as an upper-case string.
    """

    NO = "NO"
    MULTI_CPU = "MULTI_CPU"
    MULTI_GPU = "MULTI_GPU"
    MULTI_NPU = "MULTI_NPU"
    MULTI_MLU = "MULTI_MLU"
    MULTI_SDAA = "MULTI_SDAA"
    MULTI_MUSA = "MULTI_MUSA"
    MULTI_XPU = "MULTI_XPU"
    DEEPSPEED = "DEEPSPEED"
    FSDP = "FSDP"
    XLA = "XLA"
    MEGATRON_LM = "MEGATRON_LM"
    MULTI_HPU = "MULTI_HPU"
    MULTI_NEURON = "MULTI_NEURON"


_DISTRIBUTED_ALIASES = {"XLA_TPU": "XLA", "XLA_CPU": "XLA", "TPU": "XLA", "MPS": "NO", "CPU": "NO", "CUDA": "NO"}


def as_distributed_type(label: object) -> "DistributedType | str":
    """A backend's declaration (a DistributedType, or a string such as acc 0.1's "multi_cpu") as Accelerate's
    value; a value Accelerate does not know stays an upper-case string."""
    if isinstance(label, DistributedType):
        return label
    text = str(getattr(label, "value", label)).upper()
    text = _DISTRIBUTED_ALIASES.get(text, text)
    try:
        return DistributedType(text)
    except ValueError:
        return text
