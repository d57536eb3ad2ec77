"""`is_*_available` (Accelerate's `accelerate.utils.imports`, the public path of these): cheap checks that never import the package
they ask about. A package counts when it can be imported and has installed metadata (a bare directory
of that name does not). Device checks ask torch when it is already imported; otherwise they read the
hardware (acc.assembly.hardware) first and import torch only when it may say yes. Every check returns a bool.
"""

from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import sys
from typing import Any

from acc.compat.environment import parse_flag_from_env, patch_environment, str_to_bool
from acc.compat.versions import compare_versions, is_torch_version
from acc.runtime.devices import vendor_device


def _is_package_available(pkg_name: str, metadata_name: str | None = None) -> bool:
    try:
        if importlib.util.find_spec(pkg_name) is None:
            return False
    except (ImportError, ValueError):  # a parent package that fails, or a module without __spec__
        return False
    try:
        importlib.metadata.metadata(metadata_name or pkg_name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def _version_at_least(distribution: str, minimum: str) -> bool:
    try:
        return compare_versions(distribution, ">=", minimum)
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


def _torch() -> Any:
    """torch, imported if needed (device checks call this only when the hardware may be there)."""
    import torch

    return torch


def _torch_if_imported() -> Any:
    return sys.modules.get("torch")


# -------------------------------------------------------------------------------------------- packages


def is_tensorboard_available() -> bool:
    return _is_package_available("tensorboard") or _is_package_available("tensorboardX")


def is_wandb_available() -> bool:
    return _is_package_available("wandb")


def is_comet_ml_available() -> bool:
    return _is_package_available("comet_ml")


def is_mlflow_available() -> bool:
    return _is_package_available("mlflow") or _is_package_available("mlflow", "mlflow-skinny")


def is_aim_available() -> bool:
    if not _is_package_available("aim"):
        return False
    try:
        return compare_versions("aim", "<", "4.0.0")
    except (importlib.metadata.PackageNotFoundError, ValueError):
        return False


def is_clearml_available() -> bool:
    return _is_package_available("clearml")


def is_dvclive_available() -> bool:
    return _is_package_available("dvclive")


def is_swanlab_available() -> bool:
    return _is_package_available("swanlab")


def is_trackio_available() -> bool:
    return _is_package_available("trackio")


def is_datasets_available() -> bool:
    return _is_package_available("datasets")


def is_transformers_available() -> bool:
    return _is_package_available("transformers")


def is_peft_available() -> bool:
    return _is_package_available("peft")


def is_deepspeed_available() -> bool:
    return _is_package_available("deepspeed")


def is_rich_available() -> bool:
    """rich is installed and ACCELERATE_ENABLE_RICH is set (as in Accelerate)."""
    return _is_package_available("rich") and bool(parse_flag_from_env("ACCELERATE_ENABLE_RICH", False))


def is_schedulefree_available() -> bool:
    return _is_package_available("schedulefree")


def is_torchao_available() -> bool:
    return _is_package_available("torchao") and _version_at_least("torchao", "0.6.1")


def is_transformer_engine_available() -> bool:
    return _is_package_available("transformer_engine", "transformer-engine")


def is_msamp_available() -> bool:
    return _is_package_available("msamp", "ms-amp")


def is_safetensors_available() -> bool:
    return _is_package_available("safetensors")


def is_boto3_available() -> bool:
    return _is_package_available("boto3")


def is_pandas_available() -> bool:
    return _is_package_available("pandas")


def is_matplotlib_available() -> bool:
    return _is_package_available("matplotlib")


def is_timm_available() -> bool:
    return _is_package_available("timm")


def is_torchvision_available() -> bool:
    return _is_package_available("torchvision")


def is_torchdata_available() -> bool:
    return _is_package_available("torchdata")


def is_torchdata_stateful_dataloader_available() -> bool:
    return _is_package_available("torchdata") and _version_at_least("torchdata", "0.8.0")


def is_tqdm_available() -> bool:
    return _is_package_available("tqdm")


def is_import_timer_available() -> bool:
    return _is_package_available("import_timer")


def is_pytest_available() -> bool:
    return _is_package_available("pytest")


def is_triton_available() -> bool:
    return _is_package_available("triton")


def is_pynvml_available() -> bool:
    return _is_package_available("pynvml") or _is_package_available("pynvml", "nvidia-ml-py")


def is_lomo_available() -> bool:
    return _is_package_available("lomo_optim")


def is_sagemaker_available() -> bool:
    return _is_package_available("sagemaker")


def is_bnb_available(min_version: str | None = None) -> bool:
    if not _is_package_available("bitsandbytes"):
        return False
    return min_version is None or _version_at_least("bitsandbytes", min_version)


def is_bitsandbytes_multi_backend_available() -> bool:
    """bitsandbytes with its multi-backend (non-CUDA) support, which can run 8-bit/4-bit layers on the CPU."""
    if not is_bnb_available():
        return False
    import bitsandbytes as bnb

    return "multi_backend" in getattr(bnb, "features", set())


def is_4bit_bnb_available() -> bool:
    return is_bnb_available("0.39.0")


def is_8bit_bnb_available() -> bool:
    return is_bnb_available("0.37.2")


def is_megatron_lm_available() -> bool:
    """Megatron-LM (megatron-core >= 0.8 with megatron.training) and ACCELERATE_USE_MEGATRON_LM set."""
    if str_to_bool(os.environ.get("ACCELERATE_USE_MEGATRON_LM", "False")) != 1:
        return False
    if importlib.util.find_spec("megatron") is None or not _version_at_least("megatron-core", "0.8.0"):
        return False
    try:
        return importlib.util.find_spec("megatron.training") is not None
    except ImportError:
        return False


def is_pippy_available() -> bool:
    """Pipeline parallelism (torch.distributed.pipelining), in torch >= 2.4."""
    return is_torch_version(">=", "2.4.0")


def is_ipex_available() -> bool:
    """intel_extension_for_pytorch (Accelerate 1.15 dropped this check; kept for older scripts)."""
    return _is_package_available("intel_extension_for_pytorch")


# -------------------------------------------------------------------------------------------- devices


def is_cuda_available() -> bool:
    """A CUDA device torch can use, asked without initialising CUDA (torch's NVML-based check)."""
    torch = _torch_if_imported()
    if torch is None:
        from acc.assembly import hardware

        if hardware.visible_cuda_devices() == 0 or importlib.util.find_spec("torch") is None:
            return False
        torch = _torch()
    with patch_environment(PYTORCH_NVML_BASED_CUDA_CHECK="1"):
        return bool(torch.cuda.is_available())


def is_mps_available(min_version: str = "1.12") -> bool:
    """Apple's GPU through torch.backends.mps."""
    torch = _torch_if_imported()
    if torch is None:
        from acc.assembly import hardware

        if not hardware.is_apple_silicon() or importlib.util.find_spec("torch") is None:
            return False
        torch = _torch()
    return is_torch_version(">=", min_version) and bool(torch.backends.mps.is_available()) and \
        bool(torch.backends.mps.is_built())


def _intel_gpu_present() -> bool:
    from pathlib import Path

    for device in Path("/sys/bus/pci/devices").glob("*"):
        try:
            if (device / "vendor").read_text().strip() == "0x8086" and \
                    (device / "class").read_text().strip().startswith("0x03"):
                return True
        except OSError:
            continue
    return False


def is_xpu_available(check_device: bool = False) -> bool:
    """An Intel GPU through stock torch (>= 2.7)."""
    torch = _torch_if_imported()
    if torch is None:
        if not _intel_gpu_present() or importlib.util.find_spec("torch") is None:
            return False
        torch = _torch()
    if is_torch_version("<=", "2.6") or not hasattr(torch, "xpu"):
        return False
    if check_device:
        try:
            torch.xpu.device_count()
        except RuntimeError:
            return False
    return bool(torch.xpu.is_available())


@functools.lru_cache
def is_npu_available(check_device: bool = False) -> bool:
    """An Ascend NPU (torch_npu)."""
    return vendor_device("torch_npu", "npu", check_device)


@functools.lru_cache
def is_mlu_available(check_device: bool = False) -> bool:
    """A Cambricon MLU (torch_mlu)."""
    return vendor_device("torch_mlu", "mlu", check_device)


@functools.lru_cache
def is_musa_available(check_device: bool = False) -> bool:
    """A Moore Threads GPU (torch_musa)."""
    return vendor_device("torch_musa", "musa", check_device)


@functools.lru_cache
def is_sdaa_available(check_device: bool = False) -> bool:
    """A Tecorigin SDAA (torch_sdaa)."""
    return vendor_device("torch_sdaa", "sdaa", check_device)


@functools.lru_cache
def is_hpu_available(init_hccl: bool = False) -> bool:
    """An Intel Gaudi HPU (habana_frameworks.torch)."""
    if importlib.util.find_spec("habana_frameworks") is None:
        return False
    return vendor_device("habana_frameworks.torch", "hpu", False)


@functools.lru_cache
def is_torch_xla_available(check_is_tpu: bool = False, check_is_gpu: bool = False) -> bool:
    """torch_xla is installed (and USE_TORCH_XLA is not turned off); with `check_is_tpu` / `check_is_gpu`,
    its runtime also runs on a TPU / a GPU (that imports torch_xla)."""
    if check_is_tpu and check_is_gpu:
        raise ValueError("check_is_tpu and check_is_gpu cannot both be true")
    if not parse_flag_from_env("USE_TORCH_XLA", True) or not _is_package_available("torch_xla"):
        return False
    if not (check_is_tpu or check_is_gpu):
        return True
    try:
        import torch_xla.runtime as xr
    except Exception:  # noqa: BLE001 - an installed torch_xla that cannot start is not available
        return False
    kind = xr.device_type()
    return kind in ("GPU", "CUDA") if check_is_gpu else kind == "TPU"


def is_tpu_available(check_device: bool = True) -> bool:
    """A TPU through torch_xla (Accelerate's deprecated name for is_torch_xla_available(check_is_tpu=True));
    False without asking torch_xla when no TPU chip is on this host's PCI bus."""
    from acc.assembly import hardware

    if check_device and hardware.tpu_devices() == 0:
        return False
    return is_torch_xla_available(check_is_tpu=check_device)


def is_bf16_available(ignore_tpu: bool = False) -> bool:
    """bf16 works on the device in use (always on the CPU; on CUDA from compute capability 8.0)."""
    if is_tpu_available():
        return not ignore_tpu
    if is_cuda_available():
        return bool(_torch().cuda.is_bf16_supported())
    if is_mlu_available():
        return bool(_torch().mlu.is_bf16_supported())
    if is_xpu_available():
        return bool(_torch().xpu.is_bf16_supported())
    if is_mps_available():
        return bool(_torch().backends.mps.is_macos_or_newer(14, 0))
    return True


def is_fp16_available() -> bool:
    return True


def is_fp8_available() -> bool:
    """An fp8 library is installed (MS-AMP, Transformer Engine or torchao); acc itself runs fp16/bf16 only."""
    return is_msamp_available() or is_transformer_engine_available() or is_torchao_available()


def is_weights_only_available() -> bool:
    return is_torch_version(">=", "2.4.0")


def is_numpy_available(min_version: str = "1.25.0") -> bool:
    return _is_package_available("numpy") and _version_at_least("numpy", min_version)


__all__ = sorted(name for name, value in dict(globals()).items()
                 if name.startswith("is_") and getattr(value, "__module__", None) == __name__)
