"""torch.compile of prepared models (acc.runtime.compiling): which blocks regional compilation picks, in-place compiling,
the refusal of a model without repeated blocks, and the capability a backend declares."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from acc import Accelerator, AccError, TorchDynamoPlugin
from acc.contract.capabilities import Capabilities
from acc.runtime.compiling import compile_units, repeated_blocks


class Block(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x):
        return torch.tanh(self.linear(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8))  # two of one class, but the layers are more
        self.layers = nn.ModuleList([Block(), Block(), Block()])
        self.head = nn.Linear(8, 2)

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def test_repeated_blocks_are_the_largest_run_of_one_class():
    net = Net()
    assert repeated_blocks(net) == list(net.layers)
    # a tie in count goes to the run with more parameters: Block x2 (2 x 1056) over Linear x2 (16x32, 32x4)
    seq = nn.Sequential(nn.Linear(16, 32), Block(32), Block(32), nn.Linear(32, 4))
    assert repeated_blocks(seq) == [seq[1], seq[2]]
    assert repeated_blocks(nn.Sequential(nn.Linear(4, 4), nn.Tanh())) == []


def test_regional_compilation_compiles_each_block_in_place_and_computes_the_same(fresh_pm):
    torch.manual_seed(0)
    net, x = Net(), torch.randn(4, 8)
    expected = net(x)
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True,
                              dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    prepared = accelerator.prepare(net)
    assert prepared is net and not hasattr(prepared, "_orig_mod")  # the model itself, not a compiled wrapper
    compiled = [m for m in net.modules() if getattr(m, "_compiled_call_impl", None) is not None]
    assert compiled == list(net.layers)
    assert torch.allclose(prepared(x), expected)
    assert list(accelerator.unwrap_model(prepared).state_dict()) == list(Net().state_dict())


def test_regional_compilation_of_a_model_without_repeated_blocks_is_refused(fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True,
                              dynamo_plugin=TorchDynamoPlugin(backend="eager", use_regional_compilation=True))
    with pytest.raises(AccError, match="no repeated blocks.*use_regional_compilation=False"):
        accelerator.prepare(nn.Sequential(nn.Linear(4, 4), nn.Tanh()))


def test_without_regional_compilation_the_cpu_backend_compiles_the_whole_model(fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True, dynamo_backend="eager")
    prepared = accelerator.prepare(Net())
    assert hasattr(prepared, "_orig_mod")
    # a backend's own unit compiling stands aside when the run does not compile, or compiles by region
    assert compile_units(Accelerator(plugin_manager=fresh_pm, cpu=True).ctx, [Block()]) == []


def test_the_compile_capability_is_checked():
    assert Capabilities().compile == "model"
    assert "torch.compile per unit" in Capabilities(compile="backend").describe()
    with pytest.raises(ValueError, match="compile='whole'"):
        Capabilities(compile="whole")


class _Twice(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.head = nn.Linear(4, 2)
        self.tag = "original"

    def forward(self, x):
        self.seen = self.tag
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def test_accelerates_compile_regions_returns_a_compiled_twin_and_leaves_the_model_alone():
    import types

    from acc.utils import compile_regions, has_repeated_blocks, is_repeated_blocks

    model, x = _Twice(), torch.randn(3, 4)
    model.forward = types.MethodType(lambda self, x: type(self).forward(self, x), model)  # bound to the instance
    twin = compile_regions(model, backend="eager")
    twin.tag = "twin"
    assert twin is not model and twin._orig_mod is model
    assert twin.__dict__["forward"].__self__ is twin  # rebound: the twin's forward runs on the twin
    assert [type(b).__name__ for b in twin.blocks] == ["OptimizedModule"] * 2
    assert type(twin.head).__name__ == "OptimizedModule" and type(model.head) is nn.Linear
    torch.testing.assert_close(twin(x), model.head(model.blocks[1](model.blocks[0](x))))
    assert twin.seen == "twin" and not hasattr(model, "seen")
    assert twin.blocks[0]._orig_mod.weight is model.blocks[0].weight  # parameters shared, not copied
    assert is_repeated_blocks(model.blocks) and has_repeated_blocks(model) and not has_repeated_blocks(model.head)


def test_the_dynamo_plugin_takes_accelerates_launcher_variables_for_fields_left_unset(monkeypatch):
    monkeypatch.setenv("ACCELERATE_DYNAMO_BACKEND", "aot_eager")
    monkeypatch.setenv("ACCELERATE_DYNAMO_MODE", "reduce-overhead")
    monkeypatch.setenv("ACCELERATE_DYNAMO_USE_FULLGRAPH", "true")
    assert TorchDynamoPlugin().to_kwargs() == {"backend": "aot_eager", "mode": "reduce-overhead", "fullgraph": True}
    given = TorchDynamoPlugin(backend="eager", fullgraph=False)  # a field given wins over the variable
    assert given.to_kwargs() == {"backend": "eager", "mode": "reduce-overhead", "fullgraph": False}
    monkeypatch.delenv("ACCELERATE_DYNAMO_BACKEND")
    monkeypatch.delenv("ACCELERATE_DYNAMO_MODE")
    monkeypatch.delenv("ACCELERATE_DYNAMO_USE_FULLGRAPH")
    assert TorchDynamoPlugin().to_kwargs() == {} and TorchDynamoPlugin().backend is None


def test_unwrapping_a_compiled_container_leaves_the_prepared_model_as_it_is(fresh_pm):
    acc = Accelerator(plugin_manager=fresh_pm)
    model = nn.Linear(2, 4)
    outer = torch.compile(nn.DataParallel(model), backend="eager")
    kept = acc.unwrap_model(outer, keep_torch_compile=True)
    assert kept is not outer and kept._orig_mod is model  # a compiled wrapper of the module itself
    assert isinstance(outer._orig_mod, nn.DataParallel)  # the object the loop runs is not re-pointed
    assert acc.unwrap_model(outer, keep_torch_compile=False) is model
    own = torch.compile(model, backend="eager")
    assert acc.unwrap_model(own) is own  # already around the module: the same object
