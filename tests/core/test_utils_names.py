"""`acc.utils` keeps the `accelerate.utils` names a migrating script imports."""

from __future__ import annotations

import subprocess
import sys

import pytest

import acc
import acc.utils
from acc.checkpoint import ProjectConfiguration
from acc.ops import send_to_device
from acc.seed import set_seed


def test_the_accelerate_utils_names_are_the_kernels_own_objects():
    from acc.utils import AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs
    from acc.utils import ProjectConfiguration as P, send_to_device as s, set_seed as seed

    assert (P, s, seed) == (ProjectConfiguration, send_to_device, set_seed)
    assert (AutocastKwargs, DistributedDataParallelKwargs, GradScalerKwargs, InitProcessGroupKwargs) == (
        acc.AutocastKwargs, acc.DistributedDataParallelKwargs, acc.GradScalerKwargs, acc.InitProcessGroupKwargs)
    assert acc.ProjectConfiguration is ProjectConfiguration


def test_an_unknown_name_says_which_names_exist():
    with pytest.raises(AttributeError, match=r"'gather_object'.*ProjectConfiguration, send_to_device, set_seed"):
        acc.utils.gather_object  # noqa: B018


def test_importing_acc_utils_does_not_import_torch():
    code = "import sys, acc.utils; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
