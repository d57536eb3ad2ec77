"""acc.runtime.init_module in one process: the splits, the meta-device build's replay of reset_parameters (equal to a
normal build, part by part), loading a checkpoint's parts, and how the cpu backend treats init_module and meta
models."""

from __future__ import annotations

import math
import warnings

import pytest
import torch
from safetensors.torch import save_file
from torch import nn

import acc
from acc import Accelerator
from acc.errors import AccError
from acc.runtime.init_module import MetaBuild, dim0_split, flat_split


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.linear = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)
        self.scale = nn.Parameter(torch.ones(width) * 0.5)  # a real value given at registration (no reset)


def models() -> dict:
    return {
        "mlp": lambda: nn.Sequential(nn.Linear(7, 5), nn.ReLU(), Block(5), nn.Linear(5, 3)),
        "attention": lambda: nn.Sequential(nn.Embedding(11, 8), nn.MultiheadAttention(8, 2)),
        "conv": lambda: nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)),
        "transformer": lambda: nn.TransformerEncoderLayer(8, 2, dim_feedforward=12),
    }


@pytest.mark.parametrize("split", [dim0_split, flat_split])
@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("shape", [(), (1,), (4,), (7, 3), (2, 3, 4), (0, 5), (3,)])
def test_a_split_cuts_every_tensor_into_consecutive_ranges_covering_it_once(split, world, shape):
    ranges = [split(world)(shape, i) for i in range(world)]
    numel = math.prod(shape)
    assert ranges[0][0] == 0 and ranges[-1][1] == numel
    assert all(a[1] == b[0] and a[0] <= a[1] for a, b in zip(ranges, ranges[1:]))


def test_dim0_split_is_torch_chunk_along_rows():
    t = torch.arange(7 * 3).reshape(7, 3)
    for world in (2, 3, 4):
        chunks = list(torch.chunk(t, world, dim=0)) + [t[:0]] * world
        for i in range(world):
            start, stop = dim0_split(world)((7, 3), i)
            assert torch.equal(t.reshape(-1)[start:stop], chunks[i].reshape(-1))


@pytest.mark.parametrize("name", list(models()))
@pytest.mark.parametrize("world", [1, 2, 3])
def test_the_replayed_initialisation_equals_a_normal_build_part_by_part(name, world):
    make = models()[name]
    torch.manual_seed(7)
    normal = make()
    after_normal = torch.rand(3)
    parts: list[list[torch.Tensor]] = []
    for index in range(world):
        torch.manual_seed(7)
        build = MetaBuild(dim0_split(world), index)
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # torch's layers initialise in reset_parameters: nothing to warn about
            with build.context():
                model = make()
        assert torch.equal(torch.rand(3), after_normal)  # the random stream continues as after a normal build
        params = list(model.parameters())
        assert all(p.is_meta for p in params) and all(build.owns(p) for p in params)
        parts.append([build.take(p) for p in params])
        for b_meta, b_real in zip(model.buffers(), normal.buffers()):  # buffers stay real and whole
            assert not b_meta.is_meta and torch.equal(b_meta, b_real)
    for i, p in enumerate(normal.parameters()):
        assert torch.equal(torch.cat([parts[index][i] for index in range(world)]), p.detach().reshape(-1)), i


def test_empty_init_keeps_no_values_and_store_checks_the_part():
    build = MetaBuild(dim0_split(2), 1, initialize=False)
    with build.context():
        model = nn.Linear(4, 6)
    assert not build.has_value(model.weight) and build.take(model.weight) is None
    assert build.part(model.weight) == (12, 24)
    with pytest.raises(AccError, match="this process keeps elements 12..24"):
        build.store(model.weight, torch.zeros(5))
    build.store(model.weight, torch.ones(12, dtype=torch.float64))
    assert build.has_value(model.weight) and build.take(model.weight).dtype == torch.float32
    assert not build.has_value(model.weight)  # handed over: the build keeps no copy


def test_random_numbers_drawn_outside_reset_parameters_are_warned_about():
    class Drawn(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))

    with pytest.warns(UserWarning, match="outside reset_parameters"):
        with MetaBuild(dim0_split(2), 0).context():
            Drawn()


def test_load_checkpoint_in_model_reads_only_this_processs_part(tmp_path, fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)
    torch.manual_seed(3)
    reference = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6))
    reference.get_submodule("1").running_mean.fill_(0.25)
    path = tmp_path / "model.safetensors"
    save_file(reference.state_dict(), str(path))
    build = MetaBuild(dim0_split(3), 1, initialize=False)
    with build.context():
        model = nn.Sequential(nn.Linear(5, 6), nn.BatchNorm1d(6))
    accelerator._runtime.builds.append(build)  # as init_module() on a sharding backend leaves it
    acc.load_checkpoint_in_model(model, path)
    for name, param in model.named_parameters():
        start, stop = build.part(param)
        assert torch.equal(build.take(param), reference.state_dict()[name].reshape(-1)[start:stop])
    assert torch.equal(model.get_submodule("1").running_mean, torch.full((6,), 0.25))  # buffers read whole
    accelerator.end_training()


def test_cpu_builds_normally_under_init_module_and_refuses_meta_models(fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)
    torch.manual_seed(0)
    normal = nn.Linear(4, 3)
    torch.manual_seed(0)
    with accelerator.init_module():
        built = nn.Linear(4, 3)
    assert not built.weight.is_meta and torch.equal(built.weight, normal.weight)
    with pytest.raises(TypeError, match="expected True, False or None"):
        with accelerator.init_module(empty_init="yes"):
            pass
    with acc.init_empty_weights():
        meta = nn.Linear(4, 3)
    with pytest.raises(AccError, match=r"parameters on the meta device \(weight, bias\), which the cpu backend does "
                                       r"not give values to.*acc.load_checkpoint_in_model"):
        accelerator.prepare(meta)
    accelerator.end_training()
