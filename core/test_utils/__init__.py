"""`acc.test_utils`: Accelerate's `accelerate.test_utils` for acc, so Accelerate's own tests (and tests written like
them) run against acc with `accelerate` -> `acc` in their imports.

It holds `testing` (the device the tests run on, the `require_*` skip decorators, test-case bases, helpers that run
`acc launch` and other commands), `training` (the regression dataset and model the scripts train), `examples`
(`compare_against_test`) and `scripts`: acc's own versions of Accelerate's test programs, each run on one process
or under `acc launch`, exiting non-zero when a check fails. The names below are those Accelerate exports here.

It sits beside `acc.testing`, below the CLI: it may import acc's public faces (`acc`, `acc.accelerator`,
`acc.state`, `acc.utils`, `acc.data_loader`, ...) and the role packages under them, never `acc.cli` (a script
that needs a command runs the `acc` executable instead).
"""

from acc.test_utils.testing import (
    DEFAULT_LAUNCH_COMMAND,
    are_the_same_tensors,
    assert_exception,
    capture_call_output,
    device_count,
    execute_subprocess_async,
    get_launch_command,
    get_torch_dist_unique_port,
    memory_allocated_func,
    path_in_accelerate_package,
    pytest_xdist_worker_id,
    require_bnb,
    require_cpu,
    require_cuda,
    require_cuda_or_hpu,
    require_cuda_or_xpu,
    require_fp8,
    require_fp16,
    require_huggingface_suite,
    require_mlu,
    require_mps,
    require_multi_device,
    require_multi_gpu,
    require_multi_gpu_or_xpu,
    require_multi_xpu,
    require_musa,
    require_non_cpu,
    require_non_hpu,
    require_non_torch_xla,
    require_non_xpu,
    require_npu,
    require_pippy,
    require_sdaa,
    require_single_device,
    require_single_gpu,
    require_single_xpu,
    require_torch_min_version,
    require_torchao,
    require_torchvision,
    require_tpu,
    require_transformer_engine,
    require_transformer_engine_mxfp8,
    require_xpu,
    run_first,
    skip,
    slow,
    torch_device,
)
from acc.test_utils.training import RegressionDataset, RegressionModel

from acc.test_utils.scripts import test_ops, test_script, test_sync  # isort: skip  (after the names they use)

__all__ = [
    "DEFAULT_LAUNCH_COMMAND", "RegressionDataset", "RegressionModel", "are_the_same_tensors", "assert_exception",
    "capture_call_output", "device_count", "execute_subprocess_async", "get_launch_command",
    "get_torch_dist_unique_port", "memory_allocated_func", "path_in_accelerate_package", "pytest_xdist_worker_id",
    "require_bnb", "require_cpu", "require_cuda", "require_cuda_or_hpu", "require_cuda_or_xpu", "require_fp8",
    "require_fp16", "require_huggingface_suite", "require_mlu", "require_mps", "require_multi_device",
    "require_multi_gpu", "require_multi_gpu_or_xpu", "require_multi_xpu", "require_musa", "require_non_cpu",
    "require_non_hpu", "require_non_torch_xla", "require_non_xpu", "require_npu", "require_pippy", "require_sdaa",
    "require_single_device", "require_single_gpu", "require_single_xpu", "require_torch_min_version",
    "require_torchao", "require_torchvision", "require_tpu", "require_transformer_engine",
    "require_transformer_engine_mxfp8", "require_xpu", "run_first", "skip", "slow", "test_ops", "test_script",
    "test_sync", "torch_device",
]
