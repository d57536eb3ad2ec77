"""Merging a sharded checkpoint into one weights file: acc's version of Accelerate's
test_utils/scripts/test_merge_weights.py. It needs the fsdp backend and two processes or more:

    acc launch --backend fsdp --nproc 2 PATH/test_merge_weights.py

A small model trained under FSDP with `FullyShardedDataParallelPlugin(FULL_SHARD, SHARDED_STATE_DICT)` is saved
sharded, then merged by `merge_fsdp_weights` (to `model.safetensors`, and with `safe_serialization=False` to
`pytorch_model.bin`) and by the `acc merge-weights` command: each merged file differs from a fresh model's weights
and, loaded into one, gives the trained model's full weights.

acc's spelling of the steps: the sharded checkpoint is `Accelerator.save_state` (acc has no `save_fsdp_model`; its
fsdp backend writes one piece file per process), the full weights to compare with are `get_state_dict`, and the
command is `acc merge-weights CHECKPOINT OUT.safetensors` (it writes safetensors only, so Accelerate's
`merge-weights --unsafe_serialization` case is the function's `safe_serialization=False` alone). Like Accelerate's,
the script checks nothing on one process; it says so, and that the fsdp backend is what it needs.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file
from torch.utils.data import DataLoader

from acc.accelerator import Accelerator
from acc.contract.enums import DistributedType
from acc.test_utils.testing import acc_executable, torch_device
from acc.test_utils.training import RegressionDataset
from acc.utils import FullyShardedDataParallelPlugin
from acc.utils.fsdp_utils import merge_fsdp_weights


class TinyModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = torch.nn.Linear(16, 16)
        self.activation = torch.nn.ReLU()
        self.linear2 = torch.nn.Linear(16, 16)
        self.softmax = torch.nn.Softmax()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear2(self.activation(self.linear1(x)))


def setup() -> tuple[Any, FullyShardedDataParallelPlugin, Accelerator]:
    plugin = FullyShardedDataParallelPlugin(sharding_strategy="FULL_SHARD", state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(fsdp_plugin=plugin)
    return accelerator.prepare(TinyModel()), plugin, accelerator


def mock_training(accelerator: Accelerator, model: Any) -> Any:
    """Three epochs of SGD on the regression data (each sample's x spread over the 16 inputs)."""
    loader = DataLoader(RegressionDataset(length=128, seed=42), batch_size=16, shuffle=False)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader, model, optimizer = accelerator.prepare(loader, model, optimizer)
    for _ in range(3):
        for batch in loader:
            model.zero_grad()
            x = batch["x"][:, None].expand(-1, 16)
            loss = torch.nn.functional.mse_loss(model(x), batch["y"][:, None].expand(-1, 16))
            accelerator.backward(loss)
            optimizer.step()
    return model


def check_weights(operation: str, state_1: dict, state_2: dict) -> None:
    assert state_1.keys() == state_2.keys(), f"different weights: {sorted(state_1)} and {sorted(state_2)}"
    for name in state_1:
        same = torch.allclose(state_1[name].cpu(), state_2[name].cpu())
        assert same == (operation == "same"), f"{name}: expected the weights to be {operation}"


def _check_loaded(full: dict, state_dict: dict) -> None:
    fresh = TinyModel().to(torch_device)
    check_weights("diff", full, fresh.state_dict())
    fresh.load_state_dict(state_dict)
    check_weights("same", full, fresh.state_dict())


def check_safetensors_weights(path: Path, full: dict) -> None:
    _check_loaded(full, load_file(path / "model.safetensors"))


def check_pytorch_weights(path: Path, full: dict) -> None:
    _check_loaded(full, torch.load(path / "pytorch_model.bin", weights_only=True))


def test_merge_weights_safetensors(accelerator: Accelerator, checkpoint: Path, out: Path, full: dict) -> None:
    merge_fsdp_weights(checkpoint, out, safe_serialization=True)  # every process calls it; the main one writes
    if accelerator.is_main_process:
        check_safetensors_weights(out, full)


def test_merge_weights_command_safetensors(accelerator: Accelerator, checkpoint: Path, out: Path, full: dict) -> None:
    if accelerator.is_main_process:
        target = out / "command" / "model.safetensors"
        target.parent.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run([acc_executable(), "merge-weights", str(checkpoint), str(target)], capture_output=True,
                              text=True, timeout=300)
        assert proc.returncode == 0, f"acc merge-weights failed:\n{proc.stdout}{proc.stderr}"
        check_safetensors_weights(target.parent, full)
    accelerator.wait_for_everyone()


def test_merge_weights_pytorch(accelerator: Accelerator, checkpoint: Path, out: Path, full: dict) -> None:
    merge_fsdp_weights(checkpoint, out, safe_serialization=False)
    if accelerator.is_main_process:
        check_pytorch_weights(out, full)


def main() -> None:
    model, _, accelerator = setup()
    if accelerator.num_processes < 2 or accelerator.distributed_type != DistributedType.FSDP:
        accelerator.print(f"test_merge_weights: nothing checked: this run is {accelerator.distributed_type} on "
                          f"{accelerator.num_processes} process(es); merging needs a sharded checkpoint: "
                          "acc launch --backend fsdp --nproc 2 test_merge_weights.py")
        accelerator.end_training()
        return
    out = Path("test_merge_weights_fsdp_weights")
    try:
        if accelerator.is_main_process:
            out.mkdir(parents=True, exist_ok=True)
        accelerator.wait_for_everyone()
        model = mock_training(accelerator, model)
        checkpoint = accelerator.save_state(out / "sharded")
        full = accelerator.get_state_dict(model)
        for check in (test_merge_weights_safetensors, test_merge_weights_command_safetensors,
                      test_merge_weights_pytorch):
            accelerator.print(f"Testing {check.__name__}")
            check(accelerator, Path(checkpoint), out, full)
    finally:
        accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            shutil.rmtree(out, ignore_errors=True)
        accelerator.end_training()


if __name__ == "__main__":
    main()
