"""The xla hooks in this process (xla lane): collectives, the data loader's bookkeeping under the parallel
loader, parameters that keep their identity on the device, save and load through the device."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from tests.plugins.xla.conftest import needs_xla

pytestmark = needs_xla


@pytest.fixture
def accelerator(monkeypatch):
    import acc.builtin.cpu
    import acc_xla.plugin
    from acc import Accelerator
    from acc.assembly.plugins import new_plugin_manager, register

    monkeypatch.setenv("ACC_BACKEND", "xla")
    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    register(pm, acc_xla.plugin, "xla")
    accelerator = Accelerator(plugin_manager=pm)
    yield accelerator
    accelerator.end_training()


def test_setup_reports_the_xla_device_and_a_world_of_one(accelerator):
    assert accelerator.device.type == "xla" and accelerator.num_processes == 1
    assert accelerator.process_index == 0 and accelerator.distributed_type == "XLA"


def test_reductions_on_device_and_cpu_tensors(accelerator):
    device = accelerator.device
    x = torch.tensor([1.0, 5.0], device=device)
    for op in ("sum", "mean", "max", "min"):
        out = accelerator.reduce(x, op)
        assert out.device == device and out.cpu().tolist() == [1.0, 5.0]
    # one process: the identity, as Accelerate's reduce there (a CPU tensor stays on the CPU, integers stay)
    ints = accelerator.reduce(torch.tensor([3, 4]), "mean")
    assert ints.device.type == "cpu" and ints.dtype == torch.int64 and ints.tolist() == [3, 4]


def test_gather_hooks_and_objects(accelerator):
    import acc_xla.plugin as plugin

    ctx, device = accelerator.ctx, accelerator.device
    rows = torch.arange(6.0, device=device).reshape(3, 2)
    assert plugin.XlaCommunicator(ctx).all_gather(rows).cpu().tolist() == rows.cpu().tolist()
    flags = torch.tensor([True, False])
    gathered = plugin.XlaCommunicator(ctx).all_gather(flags)
    assert gathered.dtype == torch.bool and gathered.device.type == "cpu" and gathered.tolist() == [True, False]
    assert accelerator.gather(torch.tensor(2.0, device=device)).cpu().tolist() == 2.0  # one process: as given
    assert accelerator.gather_object({"a": 1}) == {"a": 1}  # one process: the object as given (Accelerate too)
    assert accelerator.broadcast(torch.tensor([7], device=device)).cpu().tolist() == [7]
    assert accelerator.broadcast_object(None) is None
    accelerator.wait_for_everyone()


def test_parameters_keep_their_identity_on_the_device(accelerator):
    model = nn.Linear(3, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    before = [id(p) for p in model.parameters()]
    model, opt = accelerator.prepare(model, opt)
    params = list(model.parameters())
    assert [id(p) for p in params] == before and all(p.device.type == "xla" for p in params)
    assert opt.optimizer.param_groups[0]["params"][0] is params[0]
    loss = model(torch.ones(4, 3, device=accelerator.device)).sum()
    accelerator.backward(loss)
    weight = params[0].detach().cpu().clone()
    opt.step()
    assert not torch.equal(params[0].detach().cpu(), weight)  # the step reached the model


def test_an_optimizer_over_cpu_parameters_is_refused(accelerator):
    from acc.errors import AccError

    with pytest.raises(AccError, match="holds parameters on cpu, not on the XLA device"):
        accelerator.prepare(torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1))


def test_the_loader_bookkeeping_follows_the_batch_the_user_holds(accelerator):
    data = TensorDataset(torch.arange(40))
    loader = accelerator.prepare(DataLoader(data, batch_size=4))
    kernel_loader = accelerator._dataloaders[0]
    assert len(loader) == 10 and loader.total_batch_size == 4
    seen, ends = [], []
    for i, (batch,) in enumerate(loader):
        time.sleep(0.01)  # let the parallel loader's thread run ahead
        assert batch.device.type == "xla"
        assert accelerator.ctx.loop.active_loader is kernel_loader
        assert kernel_loader.position() == (0, i + 1)  # not the batches read ahead
        ends.append(accelerator.ctx.loop.end_of_dataloader)
        seen.extend(batch.cpu().tolist())
    assert seen == list(range(40)) and ends == [False] * 9 + [True]
    assert accelerator.ctx.loop.active_loader is None


def test_leaving_a_loop_early_records_the_position_and_stops_the_threads(accelerator):
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(400)), batch_size=4))
    before = set(threading.enumerate())
    for i, _ in enumerate(loader):
        if i == 2:
            break
    assert accelerator._dataloaders[0].position() == (0, 3)
    deadline = time.monotonic() + 10
    for thread in set(threading.enumerate()) - before:  # the loader's threads: wait for each to end
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert threading.active_count() <= len(before)


def test_fp16_is_a_clear_error(monkeypatch):
    import acc.builtin.cpu
    import acc_xla.plugin
    from acc import Accelerator
    from acc.assembly.plugins import new_plugin_manager, register
    from acc.errors import AccError

    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    register(pm, acc_xla.plugin, "xla")
    with pytest.raises(AccError, match="'fp16' is not supported by the xla backend.*bf16"):
        Accelerator(mixed_precision="fp16", plugin_manager=pm)


def test_save_writes_cpu_tensors_and_load_maps_them_back_to_the_device(accelerator, tmp_path):
    from safetensors.torch import load_file

    model = nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    accelerator.backward(model(torch.ones(2, 3, device=accelerator.device)).sum())
    opt.step()
    opt.zero_grad()
    saved_weights = [p.detach().cpu().clone() for p in model.parameters()]
    accelerator.save_state(tmp_path / "ckpt")
    assert all(t.device.type == "cpu" for t in load_file(str(tmp_path / "ckpt" / "model_0.safetensors")).values())
    state = torch.load(tmp_path / "ckpt" / "optimizer_0.pt", weights_only=True)
    assert all(v.device.type == "cpu" for s in state["state"].values() for v in s.values())
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    accelerator.load_state(tmp_path / "ckpt")
    for p, w in zip(model.parameters(), saved_weights):
        assert p.device.type == "xla" and torch.equal(p.detach().cpu(), w)
    assert all(v.device.type == "xla" for s in opt.optimizer.state.values() for k, v in s.items() if k != "step")
    assert torch.equal(accelerator.get_state_dict(model)["0.weight"], saved_weights[0])


def test_teardown_restores_torchs_module_conversion_flag(accelerator):
    assert torch.__future__.get_swap_module_params_on_conversion()
    accelerator.end_training()
    assert not torch.__future__.get_swap_module_params_on_conversion()
