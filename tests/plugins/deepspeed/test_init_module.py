"""Models built sharded under ZeRO-3 (`accelerator.init_module()` is deepspeed.zero.Init), real processes on CPU."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file, save_file

from tests.conftest import WORKERS, read_rank_results
from tests.plugins.ddp.test_ddp import acc_launch
from tests.plugins.fsdp.test_init_module import close

pytestmark = pytest.mark.slow
ZERO3 = ["--backend", "deepspeed", "--nproc", "2", "--zero-stage", "3"]


def test_zero3_init_module_trains_like_the_normal_build_and_loads_each_ranks_part(tmp_path):
    sys.path.insert(0, str(WORKERS))
    from built_sharded import build

    torch.manual_seed(123)
    pretrained = tmp_path / "pretrained.safetensors"
    want = {k: v.contiguous() for k, v in build().state_dict().items()}
    save_file(want, str(pretrained))
    for name, args in (("normal", []), ("init", ["--build", "init_module"]),
                       ("load", ["--build", "empty_init", "--load", str(pretrained),
                                 "--weights", str(tmp_path / "w.safetensors")])):
        acc_launch(tmp_path, ZERO3, "built_sharded.py", ["--out", str(tmp_path / name), *args])
    normal, init, loaded = (read_rank_results(tmp_path / n) for n in ("normal", "init", "load"))

    for rank in (0, 1):  # built inside deepspeed.zero.Init: partitioned as built, the same weights and losses
        assert close(init[rank]["losses"], normal[rank]["losses"]), (init[rank], normal[rank])
        assert init[rank]["stream"] == normal[rank]["stream"]
    total = init[0]["total_params"]
    assert init[0]["local_params"] + init[1]["local_params"] == total and init[0]["local_params"] < 0.55 * total

    weights = load_file(str(tmp_path / "w.safetensors"))  # gathered after prepare: exactly the pretrained weights
    assert sorted(weights) == sorted(want) and all(torch.equal(weights[k], want[k]) for k in want)
    file_bytes = sum(t.numel() * t.element_size() for t in want.values())
    assert loaded[0]["bytes_read"] + loaded[1]["bytes_read"] == file_bytes  # each rank its partition alone
    assert max(loaded[r]["bytes_read"] for r in (0, 1)) <= 0.55 * file_bytes
    assert loaded[0]["losses"] != normal[0]["losses"]  # trained from the pretrained weights, not seed 0's
