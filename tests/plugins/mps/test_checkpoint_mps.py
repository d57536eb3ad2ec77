"""Checkpoints across devices: state saved on MPS holds CPU tensors only and loads on the CPU; a CPU
checkpoint is mapped onto MPS when loaded there; a file with MPS storages still loads on the CPU."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from acc import Accelerator
from acc.assembly.choose import assemble
from acc.checkpointing import files as ckpt
from acc.contract.context import ProcessInfo, RunContext
from acc.runtime.ops import leaves
from tests.plugins.mps.conftest import mps_context


class OnMps(torch.Tensor):
    """Stands in for a tensor on the MPS device, which this machine cannot make: a CPU tensor whose `device`
    says mps. Moving it to the CPU (`cpu()`, `to("cpu")`) gives a plain CPU tensor, as on a Mac. Left unmoved it
    is pickled as this class, which `torch.load(weights_only=True)` refuses, as a CPU machine cannot read the
    MPS storage a Mac would have written."""

    @property
    def device(self) -> torch.device:
        return torch.device("mps")

    def cpu(self, *args, **kwargs) -> torch.Tensor:
        with torch._C.DisableTorchFunctionSubclass():
            return self.as_subclass(torch.Tensor).clone()

    def to(self, *args, **kwargs) -> torch.Tensor:
        target = args[0] if args else kwargs.get("device")
        assert torch.device(target).type == "cpu", f"only moves to the CPU are expected, got {target}"
        return self.cpu()


def trained(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(4, 3)).pow(2).sum().backward()
    optimizer.step()
    return model, optimizer


def put_on_mps(model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Make the model's state dict and the optimizer's state report device mps (OnMps stand-ins)."""
    state = {k: v.as_subclass(OnMps) for k, v in model.state_dict().items()}
    model.state_dict = lambda *args, **kwargs: dict(state)
    for per_param in optimizer.state.values():
        for key, value in per_param.items():
            per_param[key] = value.as_subclass(OnMps)


def values(data) -> list[list]:
    return [t.tolist() for t in leaves(data)]


def weights(state: dict) -> dict[str, list]:
    return {name: t.tolist() for name, t in state.items()}


def assert_all_plain_cpu(data) -> None:
    tensors = leaves(data)
    assert tensors and all(type(t) is torch.Tensor and t.device.type == "cpu" for t in tensors)


def cpu_context(pm) -> RunContext:
    ctx = RunContext(settings=assemble(pm=pm).settings, backend="cpu")
    ctx.process = ProcessInfo(device=torch.device("cpu"))
    return ctx


@pytest.fixture
def saved_on_mps(mps_pm, fake_mps, tmp_path):
    """A checkpoint written by the mps backend from state on the MPS device; (directory, names, model, optimizer)."""
    model, optimizer = trained()
    expected_model, expected_optimizer = weights(model.state_dict()), values(optimizer.state_dict())
    put_on_mps(model, optimizer)
    directory = tmp_path / "from_mps"
    directory.mkdir()
    names = mps_pm.hook.acc_save_checkpoint(ctx=mps_context(mps_pm), directory=directory, models=[model],
                                            optimizers=[optimizer])
    return directory, names, model, optimizer, expected_model, expected_optimizer


def test_save_on_mps_moves_every_tensor_to_the_cpu(saved_on_mps, tmp_path):
    directory, names, model, optimizer, expected_model, expected_optimizer = saved_on_mps
    assert names == ["model_0.safetensors", "optimizer_0.pt"]
    opt_state = torch.load(directory / "optimizer_0.pt", weights_only=True)  # no map_location needed
    assert_all_plain_cpu(opt_state)
    assert values(opt_state) == expected_optimizer
    assert weights(load_file(str(directory / "model_0.safetensors"))) == expected_model


def test_checkpoint_saved_on_mps_loads_on_the_cpu(saved_on_mps, fresh_pm):
    directory, names, _, _, expected_model, expected_optimizer = saved_on_mps
    model, optimizer = trained(seed=1)  # different weights and moments
    assert weights(model.state_dict()) != expected_model
    manifest = {"files": ckpt.digest_many(directory, names)}
    fresh_pm.hook.acc_load_checkpoint(ctx=cpu_context(fresh_pm), directory=directory, models=[model],
                                      optimizers=[optimizer], manifest=manifest)
    assert weights(model.state_dict()) == expected_model
    assert values(optimizer.state_dict()) == expected_optimizer


def _cpu_checkpoint(pm, directory):
    """A real checkpoint written by the cpu backend after one training step; returns (model, optimizer) values."""
    accelerator = Accelerator(plugin_manager=pm, cpu=True)
    model, optimizer = accelerator.prepare(*trained())
    accelerator.save_state(directory)
    return weights(model.state_dict()), values(optimizer.optimizer.state_dict())


def test_cpu_checkpoint_is_mapped_onto_mps_when_loaded_there(mps_pm, fake_mps, fresh_pm, tmp_path, monkeypatch):
    expected_model, expected_optimizer = _cpu_checkpoint(fresh_pm, tmp_path / "from_cpu")
    # fake the device-moving step: record where each file is sent, load it on the CPU this machine has
    requested = []
    real_tensors, real_object = ckpt.load_tensors, ckpt.load_object

    def load_tensors(path, device="cpu"):
        requested.append((path.name, torch.device(device)))
        return real_tensors(path, device="cpu")

    def load_object(path, map_location="cpu"):
        requested.append((path.name, torch.device(map_location)))
        return real_object(path, map_location="cpu")

    monkeypatch.setattr(ckpt, "load_tensors", load_tensors)
    monkeypatch.setattr(ckpt, "load_object", load_object)
    model, optimizer = trained(seed=1)
    ctx = mps_context(mps_pm)
    mps_pm.hook.acc_load_checkpoint(ctx=ctx, directory=tmp_path / "from_cpu", models=[model],
                                    optimizers=[optimizer], manifest=ckpt.read_manifest(tmp_path / "from_cpu"))
    assert requested == [("model_0.safetensors", torch.device("mps")), ("optimizer_0.pt", torch.device("mps"))]
    assert weights(model.state_dict()) == expected_model
    assert values(optimizer.state_dict()) == expected_optimizer


def test_optimizer_file_holding_mps_storages_loads_on_the_cpu(fresh_pm, tmp_path, monkeypatch):
    directory = tmp_path / "ckpt"
    expected_model, expected_optimizer = _cpu_checkpoint(fresh_pm, directory)
    # rewrite the optimizer file as torch.save writes tensors that live on MPS (storages tagged "mps")
    path = directory / "optimizer_0.pt"
    state = torch.load(path, weights_only=True)
    with monkeypatch.context() as patch:
        patch.setattr(torch.serialization, "location_tag", lambda storage: "mps")
        torch.save(state, path)
    manifest = json.loads((directory / ckpt.MANIFEST).read_text())
    manifest["files"]["optimizer_0.pt"] = ckpt.digest(path)
    (directory / ckpt.MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(RuntimeError, match="mps"):  # read as saved, the file needs the MPS device ...
        torch.load(path, weights_only=True)
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)  # ... load_state maps it onto the CPU
    model, optimizer = accelerator.prepare(*trained(seed=1))
    accelerator.load_state(directory)
    assert weights(model.state_dict()) == expected_model
    assert values(optimizer.optimizer.state_dict()) == expected_optimizer
    assert_all_plain_cpu(optimizer.optimizer.state_dict())


def test_state_dict_of_a_model_on_mps_is_on_the_cpu(mps_pm, fake_mps):
    model, optimizer = trained()
    expected = weights(model.state_dict())
    put_on_mps(model, optimizer)
    state = mps_pm.hook.acc_model_state_dict(ctx=mps_context(mps_pm), model=model)
    assert_all_plain_cpu(state)
    assert weights(state) == expected
