"""Accelerate's `accelerate.test_utils.testing`, for acc: the device the tests run on, skip decorators, test-case
bases that reset acc's state, and helpers that run `acc launch` and other commands in subprocesses.

Every skip condition asks acc's own checks (`acc.utils.imports`) or torch's device queries, so a test decorated
`@require_multi_device` runs exactly where acc could run it. `get_launch_command` builds an `acc launch` command line
from Accelerate's flag spellings (acc's CLI reads them, see acc.compat.accelerate_launch), with the `acc` executable
of the interpreter running the tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import os
import shutil
import sys
import tempfile
import unittest
from pathlib import Path
from typing import Any, Callable, Iterator

import torch

import acc
from acc.state import AcceleratorState, GradientState
from acc.test_utils.processes import (  # noqa: F401  (Accelerate's testing module holds these; re-exported)
    SubprocessCallException,
    execute_subprocess_async,
    get_torch_dist_unique_port,
    pytest_xdist_worker_id,
    run_command,
)
from acc.utils.environment import parse_flag_from_env
from acc.utils.imports import (
    is_aim_available,
    is_bnb_available,
    is_clearml_available,
    is_comet_ml_available,
    is_cuda_available,
    is_datasets_available,
    is_deepspeed_available,
    is_dvclive_available,
    is_fp8_available,
    is_fp16_available,
    is_hpu_available,
    is_import_timer_available,
    is_matplotlib_available,
    is_mlflow_available,
    is_mlu_available,
    is_mps_available,
    is_musa_available,
    is_npu_available,
    is_pandas_available,
    is_peft_available,
    is_pippy_available,
    is_pytest_available,
    is_schedulefree_available,
    is_sdaa_available,
    is_swanlab_available,
    is_tensorboard_available,
    is_timm_available,
    is_torch_xla_available,
    is_torchao_available,
    is_torchdata_stateful_dataloader_available,
    is_torchvision_available,
    is_trackio_available,
    is_transformer_engine_available,
    is_transformers_available,
    is_triton_available,
    is_wandb_available,
    is_xpu_available,
)
from acc.utils.versions import compare_versions, is_torch_version

TestCase = Any  # a unittest.TestCase class or a test function

# ---------------------------------------------------------------------------------------------- the device


def _found(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def is_neuron_available() -> bool:
    """An AWS Neuron core through torch_neuronx (acc has no backend for it; tests that need one are skipped)."""
    return _found("torch_neuronx") and hasattr(torch, "neuron") and bool(torch.neuron.is_available())


def is_habana_gaudi1() -> bool:
    """The HPU in use is a first-generation Gaudi (no fp8, no pipeline parallelism)."""
    if not is_hpu_available():
        return False
    import habana_frameworks.torch.utils.experimental as htexp

    return htexp._get_device_type() == htexp.synDeviceType.synDeviceGaudi


def is_transformer_engine_mxfp8_available() -> bool:
    """Transformer Engine is installed and says this GPU supports MXFP8 block scaling."""
    if not is_transformer_engine_available():
        return False
    from transformer_engine.pytorch.fp8 import check_mxfp8_support

    return bool(check_mxfp8_support()[0])


def cuda_supports_fp8() -> bool:
    """The first visible CUDA device has compute capability 8.9 or newer (Ada, Hopper and later)."""
    return is_cuda_available() and tuple(torch.cuda.get_device_capability(0)) >= (8, 9)


def _no_allocation() -> int:
    return 0


def get_backend() -> tuple[str, int, Callable[[], int]]:
    """(device type, how many, a function giving the bytes allocated on it), the first kind found of those torch
    knows, in Accelerate's order; ("cpu", 1, 0 bytes) without any."""
    if is_torch_xla_available():
        return "xla", torch.cuda.device_count(), torch.cuda.memory_allocated
    if is_cuda_available():
        return "cuda", torch.cuda.device_count(), torch.cuda.memory_allocated
    if is_mps_available():
        allocated = getattr(getattr(torch, "mps", None), "current_allocated_memory", _no_allocation)
        return "mps", 1, allocated
    for kind, present in (("mlu", is_mlu_available), ("sdaa", is_sdaa_available), ("musa", is_musa_available),
                          ("npu", is_npu_available), ("xpu", is_xpu_available), ("hpu", is_hpu_available),
                          ("neuron", is_neuron_available)):
        if present():
            module = getattr(torch, kind)
            return kind, module.device_count(), module.memory_allocated
    return "cpu", 1, _no_allocation


torch_device, device_count, memory_allocated_func = get_backend()

# ---------------------------------------------------------------------------------------------- launching


def acc_executable() -> str:
    """The `acc` command of the interpreter running this code (its venv's bin directory), else `acc` on PATH."""
    beside = Path(sys.executable).parent / ("acc.exe" if os.name == "nt" else "acc")
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("acc") or "acc"


def get_launch_command(**kwargs: Any) -> list[str]:
    """`acc launch` with one `--NAME=VALUE` per keyword (`--NAME` for True; None is left out), in Accelerate's
    spelling, which acc's launcher reads: `get_launch_command(num_processes=2, monitor_interval=0.1)` is
    `[".../bin/acc", "launch", "--num_processes=2", "--monitor_interval=0.1"]`."""
    command = [acc_executable(), "launch"]
    for name, value in kwargs.items():
        if value is True:
            command.append(f"--{name}")
        elif value is not None:
            command.append(f"--{name}={value}")
    return command


DEFAULT_LAUNCH_COMMAND = get_launch_command(num_processes=device_count, monitor_interval=0.1)

# ---------------------------------------------------------------------------------------------- decorators


def _skip_unless(condition: bool, reason: str) -> Callable[[TestCase], TestCase]:
    return unittest.skipUnless(condition, reason)


def skip(test_case: TestCase) -> TestCase:
    """Always skip the test."""
    return unittest.skip("Test was skipped")(test_case)


_run_slow_tests = parse_flag_from_env("RUN_SLOW", default=False)


def slow(test_case: TestCase) -> TestCase:
    """Skip the test unless RUN_SLOW is set to a true value (yes, 1, true, ...)."""
    return _skip_unless(_run_slow_tests, "test is slow")(test_case)


def require_cpu(test_case: TestCase) -> TestCase:
    """Run only where no accelerator is found (torch_device is "cpu")."""
    return _skip_unless(torch_device == "cpu", "test requires only a CPU")(test_case)


def require_non_cpu(test_case: TestCase) -> TestCase:
    """Run only where an accelerator (GPU, XPU, MPS, HPU, ...) is found."""
    return _skip_unless(torch_device != "cpu", "test requires a GPU")(test_case)


def _cuda_without_xla() -> bool:
    return is_cuda_available() and not is_torch_xla_available()


def require_cuda(test_case: TestCase) -> TestCase:
    """Run only with a CUDA device and without torch_xla."""
    return _skip_unless(_cuda_without_xla(), "test requires a GPU")(test_case)


def require_cuda_or_hpu(test_case: TestCase) -> TestCase:
    """Run only with a CUDA device (without torch_xla) or an HPU."""
    return _skip_unless(_cuda_without_xla() or is_hpu_available(), "test requires a GPU or HPU")(test_case)


def require_cuda_or_xpu(test_case: TestCase) -> TestCase:
    """Run only with a CUDA device (without torch_xla) or an Intel XPU."""
    return _skip_unless(_cuda_without_xla() or is_xpu_available(), "test requires a CUDA GPU or XPU")(test_case)


def require_xpu(test_case: TestCase) -> TestCase:
    """Run only with an Intel XPU."""
    return _skip_unless(is_xpu_available(), "test requires a XPU")(test_case)


def require_non_xpu(test_case: TestCase) -> TestCase:
    """Skip the test where the device is an XPU."""
    return _skip_unless(torch_device != "xpu", "test requires a non-XPU")(test_case)


def require_non_hpu(test_case: TestCase) -> TestCase:
    """Skip the test where the device is an HPU."""
    return _skip_unless(torch_device != "hpu", "test requires a non-HPU")(test_case)


def require_mlu(test_case: TestCase) -> TestCase:
    """Run only with a Cambricon MLU."""
    return _skip_unless(is_mlu_available(), "test require a MLU")(test_case)


def require_sdaa(test_case: TestCase) -> TestCase:
    """Run only with a Tecorigin SDAA."""
    return _skip_unless(is_sdaa_available(), "test require a SDAA")(test_case)


def require_musa(test_case: TestCase) -> TestCase:
    """Run only with a Moore Threads MUSA GPU."""
    return _skip_unless(is_musa_available(), "test require a MUSA")(test_case)


def require_npu(test_case: TestCase) -> TestCase:
    """Run only with an Ascend NPU."""
    return _skip_unless(is_npu_available(), "test require a NPU")(test_case)


def require_neuron(test_case: TestCase) -> TestCase:
    """Run only with AWS Neuron cores."""
    return _skip_unless(is_neuron_available(), "test require Neuron Cores")(test_case)


def require_mps(test_case: TestCase) -> TestCase:
    """Run only where torch can use Apple's GPU (mps)."""
    return _skip_unless(is_mps_available(), "test requires a `mps` backend support in `torch`")(test_case)


def require_tpu(test_case: TestCase) -> TestCase:
    """Run only on a TPU (torch_xla running on one)."""
    return _skip_unless(is_torch_xla_available(check_is_tpu=True), "test requires TPU")(test_case)


def require_non_torch_xla(test_case: TestCase) -> TestCase:
    """Skip the test where torch_xla is installed."""
    return _skip_unless(not is_torch_xla_available(), "test requires an env without TorchXLA")(test_case)


def require_single_device(test_case: TestCase) -> TestCase:
    """Run only with exactly one accelerator (not on the CPU)."""
    return _skip_unless(torch_device != "cpu" and device_count == 1,
                        "test requires a single device accelerator")(test_case)


def _count(kind: str) -> int:
    module = getattr(torch, kind, None)
    if module is None or not hasattr(module, "device_count"):
        return 0
    try:
        return int(module.device_count())
    except RuntimeError:
        return 0


def require_single_gpu(test_case: TestCase) -> TestCase:
    """Run only with exactly one CUDA GPU."""
    return _skip_unless(_count("cuda") == 1, "test requires a GPU")(test_case)


def require_single_xpu(test_case: TestCase) -> TestCase:
    """Run only with exactly one XPU."""
    return _skip_unless(_count("xpu") == 1, "test requires a XPU")(test_case)


def require_multi_device(test_case: TestCase) -> TestCase:
    """Run only with two accelerators or more."""
    return _skip_unless(device_count > 1, "test requires multiple hardware accelerators")(test_case)


def require_multi_gpu(test_case: TestCase) -> TestCase:
    """Run only with two CUDA GPUs or more."""
    return _skip_unless(_count("cuda") > 1, "test requires multiple GPUs")(test_case)


def require_multi_xpu(test_case: TestCase) -> TestCase:
    """Run only with two XPUs or more."""
    return _skip_unless(_count("xpu") > 1, "test requires multiple XPUs")(test_case)


def require_multi_gpu_or_xpu(test_case: TestCase) -> TestCase:
    """Run only with two CUDA GPUs or XPUs or more."""
    return _skip_unless((is_cuda_available() or is_xpu_available()) and device_count > 1,
                        "test requires multiple GPUs or XPUs")(test_case)


def require_fp16(test_case: TestCase) -> TestCase:
    """Run only where fp16 mixed precision can run."""
    return _skip_unless(is_fp16_available(), "test requires FP16 support")(test_case)


def require_fp8(test_case: TestCase) -> TestCase:
    """Run only with an fp8 library installed and, on CUDA, a GPU of compute capability 8.9 or more (not on a
    first-generation Gaudi)."""
    available = is_fp8_available()
    if torch.cuda.is_available() and not cuda_supports_fp8():
        available = False
    if is_habana_gaudi1():
        available = False
    return _skip_unless(available, "test requires FP8 support")(test_case)


def require_fsdp2(test_case: TestCase) -> TestCase:
    """Run only with torch >= 2.5 (FSDP2's fully_shard)."""
    return _skip_unless(is_torch_version(">=", "2.5.0"), "test requires FSDP2 (torch >= 2.5.0)")(test_case)


def _transformers_at_least(version: str) -> bool:
    try:
        return compare_versions("transformers", ">=", version)
    except Exception:  # noqa: BLE001 - not installed, or an unreadable version
        return False


def require_tp(test_case: TestCase) -> TestCase:
    """Run only with torch >= 2.3 and transformers >= 4.52 (tensor parallelism)."""
    return _skip_unless(is_torch_version(">=", "2.3.0") and _transformers_at_least("4.52.0"),
                        "test requires torch version >= 2.3.0 and transformers version >= 4.52.0")(test_case)


def require_torch_min_version(test_case: TestCase | None = None, version: str | None = None) -> Any:
    """Run only with torch >= `version`; used as `@require_torch_min_version(version="2.4")`."""
    if test_case is None:
        return lambda case: require_torch_min_version(case, version=version)
    return _skip_unless(is_torch_version(">=", version), f"test requires torch version >= {version}")(test_case)


def require_pippy(test_case: TestCase) -> TestCase:
    """Run only where pipeline-parallel inference can run: torch's pipelining (torch >= 2.4), not a first-generation
    Gaudi, and acc's `acc.inference.prepare_pippy` working (`acc.inference.PIPELINE_INFERENCE`)."""
    from acc import inference

    return _skip_unless(is_pippy_available() and not is_habana_gaudi1() and inference.PIPELINE_INFERENCE,
                        "test requires pippy")(test_case)


def _package_decorator(check: Callable[[], bool], reason: str, doc: str) -> Callable[[TestCase], TestCase]:
    def decorator(test_case: TestCase) -> TestCase:
        return _skip_unless(check(), reason)(test_case)

    decorator.__doc__ = doc
    return decorator


require_huggingface_suite = _package_decorator(
    lambda: is_transformers_available() and is_datasets_available(), "test requires the Hugging Face suite",
    "Run only with transformers and datasets installed.")
require_datasets = _package_decorator(is_datasets_available, "test requires the datasets library",
                                      "Run only with datasets installed.")
require_transformers = _package_decorator(is_transformers_available, "test requires the transformers library",
                                          "Run only with transformers installed.")
require_peft = _package_decorator(is_peft_available, "test requires PEFT", "Run only with peft installed.")
require_timm = _package_decorator(is_timm_available, "test requires the timm library", "Run only with timm installed.")
require_torchvision = _package_decorator(is_torchvision_available, "test requires the torchvision library",
                                         "Run only with torchvision installed.")
require_triton = _package_decorator(is_triton_available, "test requires the triton library",
                                    "Run only with triton installed.")
require_schedulefree = _package_decorator(is_schedulefree_available, "test requires the schedulefree library",
                                          "Run only with schedulefree installed.")
require_bnb = _package_decorator(is_bnb_available, "test requires the bitsandbytes library",
                                 "Run only with bitsandbytes installed.")
require_deepspeed = _package_decorator(is_deepspeed_available, "test requires DeepSpeed",
                                       "Run only with DeepSpeed installed.")
require_tensorboard = _package_decorator(is_tensorboard_available, "test requires Tensorboard",
                                         "Run only with tensorboard (or tensorboardX) installed.")
require_wandb = _package_decorator(is_wandb_available, "test requires wandb", "Run only with wandb installed.")
require_trackio = _package_decorator(is_trackio_available, "test requires trackio", "Run only with trackio installed.")
require_comet_ml = _package_decorator(is_comet_ml_available, "test requires comet_ml",
                                      "Run only with comet_ml installed.")
require_aim = _package_decorator(is_aim_available, "test requires aim", "Run only with aim (< 4) installed.")
require_clearml = _package_decorator(is_clearml_available, "test requires clearml", "Run only with clearml installed.")
require_dvclive = _package_decorator(is_dvclive_available, "test requires dvclive", "Run only with dvclive installed.")
require_swanlab = _package_decorator(is_swanlab_available, "test requires swanlab", "Run only with swanlab installed.")
require_pandas = _package_decorator(is_pandas_available, "test requires pandas", "Run only with pandas installed.")
require_mlflow = _package_decorator(is_mlflow_available, "test requires mlflow", "Run only with mlflow installed.")
require_import_timer = _package_decorator(is_import_timer_available, "test requires tuna interpreter",
                                          "Run only with import_timer installed.")
require_transformer_engine = _package_decorator(is_transformer_engine_available, "test requires transformers engine",
                                                "Run only with Transformer Engine installed.")
require_transformer_engine_mxfp8 = _package_decorator(
    is_transformer_engine_mxfp8_available, "test requires transformers engine MXFP8 block scaling",
    "Run only where Transformer Engine supports MXFP8 block scaling on this GPU.")
require_torchao = _package_decorator(is_torchao_available, "test requires torchao",
                                     "Run only with torchao (>= 0.6.1) installed.")
require_matplotlib = _package_decorator(is_matplotlib_available, "test requires matplotlib",
                                        "Run only with matplotlib installed.")
require_torchdata_stateful_dataloader = _package_decorator(
    is_torchdata_stateful_dataloader_available, "test requires torchdata.stateful_dataloader",
    "Run only with torchdata's StatefulDataLoader (torchdata >= 0.8) installed.")

_atleast_one_tracker_available = (
    any((is_wandb_available(), is_tensorboard_available(), is_trackio_available(), is_swanlab_available()))
    and not is_comet_ml_available())


def require_trackers(test_case: TestCase) -> TestCase:
    """Run only with wandb, tensorboard, trackio or swanlab installed, and comet_ml not installed."""
    return _skip_unless(_atleast_one_tracker_available, "test requires at least one tracker to be available and for "
                        "`comet_ml` to not be installed")(test_case)


def run_first(test_case: TestCase) -> TestCase:
    """Mark the test `pytest.mark.order(1)`: with the pytest-order plugin it runs before the others (tests that start
    subprocesses go first where a device can be held by one process only). Unchanged without pytest."""
    if is_pytest_available():
        import pytest

        return pytest.mark.order(1)(test_case)
    return test_case

# ---------------------------------------------------------------------------------------------- test cases


def reset_state() -> None:
    """What Accelerate's AccelerateTestCase does after each test: `GradientState._reset_state()` (a fresh loop) and
    `AcceleratorState._reset_state(True)` (the run forgotten: the next `PartialState()` / `Accelerator()` sets one
    up afresh; the process group stays initialised and a new run joins it)."""
    GradientState._reset_state()
    AcceleratorState._reset_state(True)


class TempDirTestCase(unittest.TestCase):
    """One temporary directory (`self.tmpdir`, a Path) for the whole class, emptied before each test (unless
    `clear_on_setup` is False) and removed after the last."""

    clear_on_setup = True
    tmpdir: Path

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmpdir = Path(tempfile.mkdtemp())

    @classmethod
    def tearDownClass(cls) -> None:
        shutil.rmtree(cls.tmpdir, ignore_errors=True)

    def setUp(self) -> None:
        if not self.clear_on_setup:
            return
        for entry in list(self.tmpdir.iterdir()):
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry)
            else:
                entry.unlink()


class AccelerateTestCase(unittest.TestCase):
    """A TestCase after each test of which acc's state is reset (`reset_state`), so no test sees another's run."""

    def tearDown(self) -> None:
        super().tearDown()
        reset_state()


class MockingTestCase(unittest.TestCase):
    """A TestCase whose `setUp` can start mocks that stop after each test: call `self.add_mocks(m)` (a mock patcher
    or a list of them) at the end of `setUp`, after `super().setUp()`."""

    def add_mocks(self, mocks: Any) -> None:
        self.mocks = list(mocks) if isinstance(mocks, (list, tuple)) else [mocks]
        for patcher in self.mocks:
            patcher.start()
            self.addCleanup(patcher.stop)


def are_the_same_tensors(tensor: torch.Tensor) -> bool:
    """Whether `tensor` holds the same values on every process of the run."""
    from acc.utils.operations import gather

    local = tensor[None].clone().to(AcceleratorState().device)
    everyone = gather(local).cpu()
    mine = local[0].cpu()
    return all(torch.equal(everyone[i], mine) for i in range(everyone.shape[0]))

def path_in_accelerate_package(*components: str) -> Path:
    """A path inside the installed `acc` package: `path_in_accelerate_package("test_utils", "scripts",
    "test_script.py")` is acc's own version of that Accelerate script."""
    return Path(acc.__file__).resolve().parent.joinpath(*components)


@contextlib.contextmanager
def assert_exception(exception_class: type[BaseException], msg: str | None = None) -> Iterator[None]:
    """Fail (AssertionError) unless the block raises `exception_class`, with `msg` in its message when given."""
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - any exception is checked against the expected class
        assert isinstance(exc, exception_class), f"Expected exception of type {exception_class} but got {type(exc)}"
        if msg is not None:
            assert msg in str(exc), f"Expected message '{msg}' to be in exception but got '{exc}'"
    else:
        raise AssertionError(f"Expected exception of type {exception_class} but ran without issue.")


def capture_call_output(func: Callable[..., Any], *args: Any, **kwargs: Any) -> str:
    """What `func(*args, **kwargs)` printed to stdout."""
    captured = io.StringIO()
    with contextlib.redirect_stdout(captured):
        func(*args, **kwargs)
    return captured.getvalue()


__all__ = sorted(name for name in dir() if name.startswith(("require_", "is_")) or name in {
    "DEFAULT_LAUNCH_COMMAND", "AccelerateTestCase", "MockingTestCase", "SubprocessCallException", "TempDirTestCase",
    "acc_executable", "are_the_same_tensors", "assert_exception", "capture_call_output", "cuda_supports_fp8",
    "device_count", "execute_subprocess_async", "get_backend", "get_launch_command", "get_torch_dist_unique_port",
    "memory_allocated_func", "parse_flag_from_env", "path_in_accelerate_package", "pytest_xdist_worker_id",
    "reset_state", "run_command", "run_first", "skip", "slow", "torch_device"})
