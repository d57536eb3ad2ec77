"""Real runs on the GPU of an Apple Silicon Mac: the shared example trains on MPS, the fallback variable reaches
the worker, checkpoints move between MPS and the CPU. Skipped, with the reason, where torch cannot use MPS."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

import acc.builtin.cpu
from acc import Accelerator
from acc.assembly.plugins import new_plugin_manager, register
from tests.conftest import ACC, ROOT, run
from tests.plugins.mps.conftest import requires_mps

pytestmark = [requires_mps, pytest.mark.slow]


@pytest.mark.parametrize("mode", ["no", "fp16", "bf16"])
def test_quickstart_trains_on_mps(tmp_path, mode):
    proc = run([ACC, "launch", "--backend", "mps", "--mixed-precision", mode, str(ROOT / "examples" / "quickstart.py"),
                "--epochs", "5"], tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    assert "training on 1 process(es), backend mps, device mps" in proc.stdout
    losses = [float(x) for x in re.findall(r"train loss ([0-9.]+)", proc.stdout)]
    assert len(losses) == 5 and losses[-1] < 0.8 * losses[0], losses
    assert "500 samples" in proc.stdout


def test_fallback_variable_reaches_the_worker(tmp_path):
    (tmp_path / "show.py").write_text(
        "import os\nfrom acc import Accelerator\na = Accelerator()\n"
        "print('fallback', os.environ.get('PYTORCH_ENABLE_MPS_FALLBACK'), 'device', a.device)\n"
    )
    proc = run([ACC, "launch", "--backend", "mps", "--mps-fallback", "show.py"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "fallback 1 device mps"
    assert "mps_fallback is on" not in proc.stderr  # set before torch started: no late-variable warning


def _cpu_pm():
    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    return pm


def _train_and_save(pm, directory) -> dict[str, torch.Tensor]:
    accelerator = Accelerator(plugin_manager=pm)
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=0.1))
    accelerator.backward(model(torch.randn(4, 3, device=accelerator.device)).pow(2).sum())
    optimizer.step()
    accelerator.save_state(directory)
    return {k: v.cpu() for k, v in model.state_dict().items()}


def _load(pm, directory) -> tuple[Accelerator, nn.Module, torch.optim.Optimizer]:
    accelerator = Accelerator(plugin_manager=pm)
    torch.manual_seed(1)
    model = nn.Linear(3, 2)
    model, optimizer = accelerator.prepare(model, torch.optim.Adam(model.parameters(), lr=0.1))
    with pytest.warns(UserWarning, match="was saved with backend"):
        accelerator.load_state(directory)
    return accelerator, model, optimizer.optimizer


def _same(model: nn.Module, expected: dict[str, torch.Tensor]) -> bool:
    return all(torch.equal(v.cpu(), expected[k]) for k, v in model.state_dict().items())


def test_checkpoint_moves_from_mps_to_cpu_and_back(mps_pm, tmp_path, monkeypatch):
    monkeypatch.setenv("ACC_BACKEND", "mps")
    on_mps = _train_and_save(mps_pm, tmp_path / "mps")
    monkeypatch.setenv("ACC_BACKEND", "cpu")
    accelerator, model, optimizer = _load(_cpu_pm(), tmp_path / "mps")
    assert accelerator.device == torch.device("cpu") and _same(model, on_mps)
    assert all(t.device.type == "cpu" for s in optimizer.state.values() for t in s.values())

    on_cpu = _train_and_save(_cpu_pm(), tmp_path / "cpu")
    monkeypatch.setenv("ACC_BACKEND", "mps")
    accelerator, model, optimizer = _load(mps_pm, tmp_path / "cpu")
    assert accelerator.device == torch.device("mps") and _same(model, on_cpu)
    assert all(p.device.type == "mps" for p in model.parameters())
    assert all(s["exp_avg"].device.type == "mps" for s in optimizer.state.values())
