"""The Accelerator facade on the embedded cpu backend: single-process behaviour is exact."""

from __future__ import annotations

import random
from collections import namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import acc
from acc import Accelerator, set_seed
from acc.runtime.optim import AcceleratedOptimizer, AcceleratedScheduler


@pytest.fixture
def accelerator(fresh_pm):
    return Accelerator(plugin_manager=fresh_pm, cpu=True)


def test_process_facts(accelerator):
    assert accelerator.backend == "cpu" and accelerator.device == torch.device("cpu")
    assert (accelerator.num_processes, accelerator.process_index, accelerator.local_process_index) == (1, 0, 0)
    assert accelerator.is_main_process and accelerator.is_local_main_process and accelerator.is_last_process
    assert accelerator.distributed_type == acc.DistributedType.NO == "NO" and not accelerator.use_distributed


def test_state_objects_are_views_of_the_run(accelerator):
    from acc.state import AcceleratorState, GradientState, PartialState

    state = PartialState()
    assert (state.num_processes, state.process_index, state.device) == (1, 0, accelerator.device)
    assert state.distributed_type == acc.DistributedType.NO and state.is_main_process and state.is_last_process
    assert "Distributed environment: DistributedType.NO" in repr(accelerator.state)
    assert "Mixed precision type: no" in repr(AcceleratorState())
    grads = GradientState()
    assert grads.sync_gradients and grads.num_steps == 1 and not grads.end_of_dataloader
    accelerator.gradient_accumulation_steps = 3
    assert GradientState().num_steps == 3 and accelerator.gradient_state.plugin_kwargs["num_steps"] == 3
    with state.split_between_processes([1, 2, 3]) as part:
        assert part == [1, 2, 3]
    assert state.on_main_process(lambda: "ran")() == "ran" and state.on_process(lambda: 1, process_index=1)() is None


def test_default_plugin_manager_comes_from_the_environment(monkeypatch):
    monkeypatch.setenv("ACC_GRADIENT_ACCUMULATION_STEPS", "3")
    a = Accelerator()
    assert a.backend == "cpu" and a.gradient_accumulation_steps == 3
    assert a.settings.source("gradient_accumulation_steps") == "env ACC_GRADIENT_ACCUMULATION_STEPS"


def test_code_arguments_override_and_warn_when_contradicting_explicit_settings(monkeypatch, fresh_pm):
    monkeypatch.setenv("ACC_GRADIENT_ACCUMULATION_STEPS", "3")
    with pytest.warns(UserWarning, match="overrides gradient_accumulation_steps=3 from env"):
        a = Accelerator(gradient_accumulation_steps=2, plugin_manager=fresh_pm)
    assert a.gradient_accumulation_steps == 2 and a.settings.source("gradient_accumulation_steps").startswith("code")
    with pytest.raises(acc.AccError, match=r"Accelerator\(mixed_precision='fp8'\): 'fp8' is not supported: .*expected one of"):
        Accelerator(mixed_precision="fp8", plugin_manager=fresh_pm)


def test_cpu_backend_refuses_a_distributed_launch(monkeypatch, fresh_pm):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    with pytest.raises(acc.AccError) as info:
        Accelerator(plugin_manager=fresh_pm)
    assert "WORLD_SIZE=2" in str(info.value) and "ACC_BACKEND=ddp" in str(info.value)


def test_prepare_returns_objects_in_order_and_passes_others_through(accelerator):
    model = nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1)
    loader = DataLoader(TensorDataset(torch.arange(10.0)), batch_size=4)
    other = {"not": "prepared"}
    out = accelerator.prepare(loader, other, sched, model, opt)
    assert out[1] is other and out[3] is model
    assert isinstance(out[4], AcceleratedOptimizer) and out[4].optimizer is opt
    assert isinstance(out[2], AcceleratedScheduler) and out[2].scheduler is sched
    assert [b[0].tolist() for b in out[0]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert accelerator.prepare(model) is model  # a single object comes back alone
    # what was prepared comes back unchanged, as in Accelerate (and is not registered twice)
    assert accelerator.prepare(out[4]) is out[4] and accelerator.prepare(out[0]) is out[0]
    assert len(accelerator._optimizers) == 1 and len(accelerator._dataloaders) == 1


def test_training_matches_a_plain_loop_exactly(accelerator):
    def train(use_acc: bool) -> torch.Tensor:
        set_seed(0)
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        data = TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
        loader = DataLoader(data, batch_size=8, shuffle=False)
        if use_acc:
            model, opt, loader = accelerator.prepare(model, opt, loader)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            accelerator.backward(loss) if use_acc else loss.backward()
            opt.step()
            opt.zero_grad()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.equal(train(True), train(False))


def test_collectives_are_identities_on_one_process(accelerator):
    t = torch.arange(6.0).reshape(3, 2)
    assert accelerator.gather(t) is t  # on one process Accelerate returns the input as it is
    assert accelerator.gather(torch.tensor(5.0)).shape == ()
    nested = {"a": t, "b": [t + 1, (t + 2,)]}
    gathered = accelerator.gather(nested)
    assert torch.equal(gathered["b"][1][0], t + 2) and isinstance(gathered["b"][1], tuple)
    for op in ("sum", "mean", "max", "min"):
        assert torch.equal(accelerator.reduce(t, reduction=op), t)
    assert torch.equal(accelerator.broadcast(t), t)
    assert accelerator.broadcast_object({"x": 1}) == {"x": 1}
    assert accelerator.broadcast_object(None) is None
    assert accelerator.gather_object("me") == "me"  # on one process, the object itself (Accelerate's)
    assert torch.equal(accelerator.pad_across_processes(t, dim=1), t)
    with pytest.raises(ValueError, match="reduction 'avg' is not one of"):
        accelerator.reduce(t, reduction="avg")
    accelerator.wait_for_everyone()


def test_reduce_does_not_modify_the_input_and_ignores_scale_as_accelerate_does(accelerator):
    t = torch.ones(3)
    with pytest.warns(UserWarning, match=r"reduce\(scale=2.0\) is ignored"):
        out = accelerator.reduce(t, reduction="sum", scale=2.0)
    assert torch.equal(t, torch.ones(3)) and torch.equal(out, t) and out is not t


def test_gather_keeps_namedtuples(accelerator):
    Pair = namedtuple("Pair", "x y")
    out = accelerator.gather(Pair(torch.ones(2), torch.zeros(2)))
    assert isinstance(out, Pair) and torch.equal(out.x, torch.ones(2))


def test_gather_for_metrics_returns_each_sample_once(accelerator):
    loader = accelerator.prepare(DataLoader(TensorDataset(torch.arange(10)), batch_size=4))
    seen = []
    for (x,) in loader:
        seen.extend(accelerator.gather_for_metrics(x).tolist())
    assert seen == list(range(10))
    objects = []
    for (x,) in loader:
        objects.extend(accelerator.gather_for_metrics([f"s{i}" for i in x.tolist()], use_gather_object=True))
    assert objects == [f"s{i}" for i in range(10)]


def test_split_between_processes_on_one_process_is_everything(accelerator):
    with accelerator.split_between_processes(["a", "b", "c"]) as part:
        assert part == ["a", "b", "c"]
    with accelerator.split_between_processes({"x": torch.arange(3)}) as part:
        assert torch.equal(part["x"], torch.arange(3))


def test_main_process_first_print_and_on_main_process(accelerator, capsys):
    order = []
    with accelerator.main_process_first():
        order.append("main")
    accelerator.print("hello", 1)
    assert accelerator.on_main_process(lambda: 42)() == 42
    assert order == ["main"] and capsys.readouterr().out == "hello 1\n"


def test_unwrap_and_end_training(accelerator):
    model = accelerator.prepare(nn.Linear(2, 2))
    assert accelerator.unwrap_model(model) is model
    accelerator.end_training()
    accelerator.end_training()  # idempotent


def test_set_seed_makes_python_numpy_and_torch_repeatable():
    import numpy as np

    set_seed(123)
    a = (random.random(), np.random.rand(), torch.rand(1).item())
    set_seed(123)
    assert a == (random.random(), np.random.rand(), torch.rand(1).item())


def test_shuffled_loader_order_depends_on_seed_and_epoch(fresh_pm):
    def orders(seed: int) -> list[list[int]]:
        set_seed(seed)
        a = Accelerator(plugin_manager=fresh_pm)
        loader = a.prepare(DataLoader(TensorDataset(torch.arange(16)), batch_size=4, shuffle=True))
        return [[i for (x,) in loader for i in x.tolist()] for _ in range(2)]

    first, again, other = orders(7), orders(7), orders(8)
    assert first == again and first != other
    assert first[0] != first[1] and sorted(first[0]) == sorted(first[1]) == list(range(16))


def test_split_keeps_a_dataset_a_dataset_and_pads_as_accelerate_does():
    """split_between_processes on an object with `select` (a datasets.Dataset) gives a Dataset back."""
    from acc.runtime.collectives import split

    class Rows:  # the part of datasets.Dataset's interface the split uses
        def __init__(self, rows):
            self.rows = list(rows)

        def __len__(self):
            return len(self.rows)

        def __getitem__(self, i):
            return self.rows[i]

        def select(self, indices):
            return Rows(self.rows[i] for i in indices)

    parts = [split(Rows("abcde"), 2, r, apply_padding=True) for r in range(2)]
    assert all(isinstance(p, Rows) for p in parts) and [p.rows for p in parts] == [list("abc"), list("dee")]
    assert split(list(range(5)), 3, 2, apply_padding=False) == [4]
    assert split(torch.arange(5), 2, 1, apply_padding=True).tolist() == [3, 4, 4]
    assert split((1, 2, 3), 2, 1, apply_padding=True) == (3, 3)
    with pytest.raises(ValueError, match="same length"):
        split({"a": [1, 2], "b": [1]}, 2, 0, False)


def test_zero_grad_passes_set_to_none_only_to_optimizers_that_take_it(accelerator):
    class NoSetToNone(torch.optim.SGD):
        def zero_grad(self) -> None:  # an older optimizer's signature
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = None

    for cls, calls in ((torch.optim.SGD, 3), (NoSetToNone, 3)):
        model = nn.Linear(2, 1)
        opt = accelerator.prepare(cls(model.parameters(), lr=0.1))
        for _ in range(calls):  # repeated: the signature check is cached per function and must stay right
            model(torch.ones(1, 2)).sum().backward()
            opt.zero_grad()
            assert model.weight.grad is None
    model = nn.Linear(2, 1)
    opt = accelerator.prepare(NoSetToNone(model.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="NoSetToNone.zero_grad takes no set_to_none"):
        opt.zero_grad(set_to_none=False)
    sgd = accelerator.prepare(torch.optim.SGD(model.parameters(), lr=0.1))
    model(torch.ones(1, 2)).sum().backward()
    sgd.zero_grad(set_to_none=False)
    assert model.weight.grad is not None and not model.weight.grad.any()


def test_accelerates_torch_device_variable_names_the_process_device(monkeypatch, fresh_pm):
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", "cpu:0")
    assert str(Accelerator(plugin_manager=fresh_pm).device) == "cpu:0"


@pytest.mark.parametrize("device_map", [{"": "cpu"}, {"a": 0, "b": "disk"}])
def test_an_8bit_model_offloaded_to_cpu_or_disk_is_refused_before_anything_moves(fresh_pm, device_map):
    model = torch.nn.Linear(2, 2)
    model.is_loaded_in_8bit, model.hf_device_map = True, device_map
    with pytest.raises(ValueError, match="8-bit or 4-bit precision with CPU or disk offload"):
        Accelerator(plugin_manager=fresh_pm).prepare_model(model)
    plain = torch.nn.Linear(2, 2)
    plain.hf_device_map = device_map  # not quantized: prepared as usual
    Accelerator(plugin_manager=fresh_pm).prepare_model(plain)
