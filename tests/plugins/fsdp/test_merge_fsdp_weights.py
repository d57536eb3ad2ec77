"""acc.utils.merge_fsdp_weights (Accelerate's signature) on a checkpoint saved by 2 real fsdp processes."""

from __future__ import annotations

import sys

import pytest
import torch
from safetensors.torch import load_file

from acc.errors import CheckpointError
from acc.utils import merge_fsdp_weights
from tests.conftest import WORKERS
from tests.plugins.ddp.test_ddp import acc_launch

pytestmark = pytest.mark.slow
FSDP2 = ["--backend", "fsdp", "--nproc", "2", "--fsdp-wrap", "transformer_layer=Block"]


def test_merge_fsdp_weights_gives_the_plain_models_weights(tmp_path):
    acc_launch(tmp_path, FSDP2, "layers.py", ["--out", str(tmp_path / "o"), "--save", str(tmp_path / "ckpt"),
                                              "--save-model", str(tmp_path / "model")])
    sys.path.insert(0, str(WORKERS))
    from layers import build

    saved = load_file(str(tmp_path / "model" / "model.safetensors"))  # save_model's whole weights
    path = merge_fsdp_weights(tmp_path / "ckpt", tmp_path / "merged")
    assert path == tmp_path / "merged" / "model.safetensors"
    merged = load_file(str(path))
    assert sorted(merged) == sorted(saved) and all(torch.equal(merged[k], saved[k]) for k in saved)
    build().load_state_dict(merged, strict=True)

    path = merge_fsdp_weights(str(tmp_path / "ckpt"), str(tmp_path / "bin"), safe_serialization=False,
                              remove_checkpoint_dir=True)
    assert path.name == "pytorch_model.bin" and sorted(p.name for p in path.parent.iterdir()) == ["pytorch_model.bin"]
    as_torch = torch.load(path, weights_only=True)
    assert all(torch.equal(as_torch[k], saved[k]) for k in saved)
    assert not (tmp_path / "ckpt").exists()  # removed as asked
    with pytest.raises(CheckpointError):
        merge_fsdp_weights(tmp_path / "ckpt", tmp_path / "again")
