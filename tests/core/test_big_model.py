"""acc.big_model: empty init, device-map planning, memory-mapped loading, offload hooks, clear errors."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from acc.big_model import (
    DeviceMapError,
    compute_module_sizes,
    cpu_offload,
    disk_offload,
    dispatch_model,
    infer_auto_device_map,
    init_empty_weights,
    load_checkpoint_and_dispatch,
    parse_memory,
    read_safetensors_index,
    remove_hooks,
)
from acc.big_model.planner import lookup
from acc.errors import AccError, CheckpointError
from acc.hooks import ModelHook, add_hook_to_module
from tests.conftest import clean_env

MB = 10**6


class Block(nn.Module):
    def __init__(self, d: int = 32, h: int = 64):
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, h)
        self.fc2 = nn.Linear(h, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(torch.relu(self.fc1(self.norm(x))))


class Net(nn.Module):
    """Embedding, blocks, a head tied to the embedding, and a buffer computed at build time."""

    def __init__(self, n: int = 8, d: int = 32, h: int = 64, vocab: int = 50):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.arange(1, d + 1, dtype=torch.float32) / d, persistent=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.embed(ids) * self.scale
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def bytes_of(module: nn.Module) -> int:
    """Bytes of a module's parameters and buffers, shared ones once (computed independently of acc)."""
    seen = {id(t): t for t in [*module.parameters(), *module.buffers()]}
    return sum(t.numel() * t.element_size() for t in seen.values())


def placement(model: nn.Module, device_map: dict) -> dict[str, object]:
    """Device of every parameter/buffer name (tied ones under each name) per the map."""
    names = [n for n, _ in model.named_parameters(remove_duplicate=False)]
    names += [n for n, _ in model.named_buffers(remove_duplicate=False)]
    return {n: lookup(device_map, n) for n in names}


def per_device(model: nn.Module, device_map: dict) -> dict[object, int]:
    """Bytes each device holds per the map, each tensor counted once."""
    out: dict[object, int] = {}
    seen = set()
    for name, t in [*model.named_parameters(remove_duplicate=False), *model.named_buffers(remove_duplicate=False)]:
        if id(t) not in seen:
            seen.add(id(t))
            device = lookup(device_map, name)
            out[device] = out.get(device, 0) + t.numel() * t.element_size()
    return out


@pytest.fixture
def reference():
    torch.manual_seed(0)
    model = Net().eval()
    ids = torch.randint(0, 50, (3, 7))
    with torch.no_grad():
        return model, ids, model(ids)


def empty_net(**kwargs) -> Net:
    with init_empty_weights():
        return Net(**kwargs).eval()


# ---------------------------------------------------------------------------------------------- empty init


def test_init_empty_weights_allocates_nothing():
    with init_empty_weights(include_buffers=True):
        model = nn.Sequential(*[nn.Linear(50_000, 50_000) for _ in range(3)])  # 30 GB of float32
    assert all(p.device.type == "meta" for p in model.parameters())
    assert compute_module_sizes(model)[""] == 3 * (50_000 * 50_001) * 4


def test_init_empty_weights_keeps_buffers_and_ties_and_restores_torch():
    model = empty_net()
    assert all(p.device.type == "meta" for p in model.parameters())
    assert model.head.weight is model.embed.weight
    assert model.scale.device.type == "cpu" and torch.equal(model.scale, torch.arange(1, 33) / 32)
    with init_empty_weights(include_buffers=True):
        with_buffers = Net()
    assert with_buffers.scale.device.type == "meta"
    after = Net()  # outside the context torch builds real modules again
    assert all(p.device.type == "cpu" for p in after.parameters()) and after.scale.device.type == "cpu"


# ---------------------------------------------------------------------------------------------- planning


def test_plan_fills_gpus_in_order_then_cpu_then_disk_within_budgets():
    model = empty_net()
    block = bytes_of(model.blocks[0])
    budgets = {0: 3 * block, 1: 2.5 * block, "cpu": 2 * block}
    device_map = infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=["Block"])
    places = placement(model, device_map)
    order = {0: 0, 1: 1, "cpu": 2, "disk": 3}
    sequence = [order[places[f"blocks.{i}.fc1.weight"]] for i in range(8)]
    assert sequence == sorted(sequence) and {0, 1, 2, 3} <= set(sequence)  # in order, every device used
    totals = per_device(model, device_map)
    largest = block  # room kept on the execution device (GPU 0) to run offloaded blocks
    assert totals[0] <= budgets[0] - largest
    assert totals[1] <= budgets[1] and totals["cpu"] <= budgets["cpu"]
    assert sum(totals.values()) == bytes_of(model)


def test_no_split_module_classes_stay_whole():
    model = empty_net()
    budgets = {0: int(2.5 * bytes_of(model.blocks[0])), "cpu": 10 * MB}
    split = infer_auto_device_map(model, max_memory=budgets)
    assert any(k.startswith("blocks.") and k.count(".") >= 2 for k in split)  # without it a block is cut
    whole = infer_auto_device_map(model, max_memory=budgets, no_split_module_classes=[Block])
    places = placement(model, whole)
    for i in range(8):
        assert len({d for n, d in places.items() if n.startswith(f"blocks.{i}.")}) == 1
    assert not any(k.startswith("blocks.") and k.count(".") >= 2 for k in whole)


def test_tied_weights_stay_together():
    model = empty_net()
    embed, block = bytes_of(model.embed), bytes_of(model.blocks[0])
    # GPU 0 holds the scale buffer, the embedding (and the tied head) but no block beside the one it keeps
    # room for: without the tie the head would follow the blocks to the CPU.
    device_map = infer_auto_device_map(model, max_memory={0: embed + block + 4 * 32 + 10, "cpu": 10 * MB},
                                       no_split_module_classes=["Block"])
    places = placement(model, device_map)
    assert places["embed.weight"] == places["head.weight"] == 0
    assert places["blocks.7.fc1.weight"] == "cpu"
    # a tie between two no-split blocks pulls the later block to the earlier one's device
    model.blocks[6].fc2.weight = model.blocks[0].fc2.weight
    device_map = infer_auto_device_map(model, max_memory={0: 3 * block, "cpu": 10 * MB},
                                       no_split_module_classes=["Block"])
    places = placement(model, device_map)
    assert places["blocks.6.fc1.weight"] == places["blocks.0.fc1.weight"] == 0


def test_device_map_prints_sizes_and_totals_and_can_be_edited(reference, tmp_path):
    plain, ids, expected = reference
    model = empty_net()
    block = bytes_of(model.blocks[0])
    device_map = infer_auto_device_map(model, max_memory={"cpu": 4 * block}, no_split_module_classes=["Block"])
    text = str(device_map)
    for name, device in device_map.items():
        assert any(line.split()[:2] == [name, str(device)] for line in text.splitlines())
    assert "cpu:" in text and "disk:" in text and "kept free" in text
    assert eval(repr(device_map)) == dict(device_map)  # noqa: S307 - the repr is a plain dict literal
    edited = dict(device_map)
    edited["blocks.0"] = "disk"
    save_file({k: v for k, v in plain.state_dict().items() if k != "head.weight"}, tmp_path / "model.safetensors")
    model = load_checkpoint_and_dispatch(model, tmp_path / "model.safetensors", device_map=edited,
                                         offload_folder=tmp_path / "offload")
    assert model.blocks[0].fc1.weight.device.type == "meta"
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=1e-5)


def test_a_budget_too_small_for_the_largest_layer_leaves_the_device_empty_and_says_so(caplog):
    # as Accelerate: the CPU keeps room for the largest unsplittable layer, so with less than that nothing goes
    # there, everything goes to disk (unlimited), and a log line says what the device would need
    model = empty_net()
    block = bytes_of(model.blocks[0])
    with caplog.at_level("INFO", logger="acc.big_model.auto_map"):
        device_map = infer_auto_device_map(model, max_memory={"cpu": block // 2}, no_split_module_classes=["Block"])
    assert set(device_map.values()) == {"disk"}
    assert any("insufficient memory" in r.message and "cpu:" in r.message for r in caplog.records)
    with pytest.warns(UserWarning, match=r"above max_memory\['disk'\]"):
        infer_auto_device_map(model, max_memory={"cpu": 2 * block, "disk": 3 * block}, no_split_module_classes=["Block"])
    with pytest.raises(AccError, match="no module of that class"):
        infer_auto_device_map(model, max_memory={"cpu": MB}, no_split_module_classes=["Blok"])


def test_bad_device_maps_are_refused_with_the_name(reference):
    model = reference[0]
    # names that are no module or tensor are said and left out, as Accelerate does (a tensor left without a
    # device by that is the error below)
    with pytest.warns(UserWarning, match=r"do not match any submodules or tensors of Net and are ignored: \['blocks\.99'\]"):
        dispatch_model(model, {"blocks.99": "cpu", "": "cpu"})
    with pytest.warns(UserWarning, match="did you mean 'blocks.0'"), \
            pytest.raises(DeviceMapError, match=r"places no device for"):
        dispatch_model(model, {"blcks.0": "cpu", "embed": "cpu", "head": "cpu"})
    with pytest.raises(DeviceMapError, match=r"places no device for .*'head'"):
        dispatch_model(model, {"embed": "cpu", "blocks": "cpu"})
    with pytest.raises(DeviceMapError, match="device_map\\['embed'\\].*'gpu0' is not valid"):
        dispatch_model(model, {"embed": "gpu0", "blocks": "cpu", "head": "cpu"})
    with pytest.raises(DeviceMapError, match="tied tensors"):
        dispatch_model(model, {"": "cpu", "head": "disk"})
    if not torch.cuda.is_available():
        with pytest.raises(DeviceMapError, match="uses GPU 0, but this process sees 0 CUDA"):
            dispatch_model(model, {"": 0})


@pytest.mark.cuda
def test_a_model_dispatched_to_gpu_0_runs_there(reference):
    model, ids, expected = reference
    dispatch_model(model, {"": 0})
    assert {p.device for p in model.parameters()} == {torch.device("cuda", 0)}
    with torch.no_grad():
        out = model(ids.to("cuda:0"))
    assert out.device == torch.device("cuda", 0)
    torch.testing.assert_close(out.cpu(), expected, rtol=1e-4, atol=1e-5)


def test_memory_sizes():
    assert parse_memory("400MB") == 400 * MB and parse_memory("10GiB") == 10 * 2**30
    assert parse_memory("1.5 gb") == 1_500_000_000 and parse_memory(1234) == 1234
    with pytest.raises(AccError, match="'10 parsecs'"):
        parse_memory("10 parsecs")


# ---------------------------------------------------------------------------------------------- loading


def write_checkpoint(model: nn.Module, tmp_path: Path, kind: str, fresh_pm=None) -> Path:
    """The model's weights as a single file, a sharded index (write_sharded) or an acc checkpoint."""
    state = {k: v for k, v in model.state_dict().items() if k != "head.weight"}  # tied: stored once
    if kind == "file":
        save_file(state, tmp_path / "model.safetensors")
        return tmp_path / "model.safetensors"
    if kind == "sharded":
        from acc.checkpointing.checkpointer import write_sharded

        names = write_sharded(state, tmp_path / "sharded", 20_000)
        assert len(names) > 3
        return tmp_path / "sharded"
    from acc import Accelerator

    accelerator = Accelerator(plugin_manager=fresh_pm)
    accelerator.prepare(model)
    return accelerator.save_state(tmp_path / "acc_ckpt")


@pytest.mark.parametrize("kind", ["file", "sharded", "acc"])
@pytest.mark.parametrize("device_map", ["cpu", "auto"])
def test_load_checkpoint_and_dispatch_matches_the_plain_model(reference, tmp_path, kind, device_map, fresh_pm):
    plain, ids, expected = reference
    checkpoint = write_checkpoint(plain, tmp_path, kind, fresh_pm)
    model = empty_net()
    block = bytes_of(model.blocks[0])
    budget = {"cpu": 4 * block} if device_map == "auto" else None
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map={"": "cpu"} if device_map == "cpu" else "auto",
                                         max_memory=budget, no_split_module_classes=["Block"],
                                         offload_folder=tmp_path / "offload")
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=1e-5)
    assert model.head.weight is model.embed.weight or model.head.weight.is_meta
    if device_map == "auto":
        resident = sum(t.numel() * t.element_size() for t in {id(t): t for t in model.parameters()}.values()
                       if not t.is_meta)
        assert 0 < resident <= 4 * block and "disk" in model.hf_device_map.values()
        assert not list((tmp_path / "offload").glob("*.dat"))  # float32 disk weights are read from the checkpoint


def test_offloaded_weights_are_loaded_just_in_time_and_released(reference, tmp_path):
    plain, ids, expected = reference
    checkpoint = write_checkpoint(plain, tmp_path, "file")
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map={"": "disk"},
                                         offload_folder=tmp_path / "offload")
    seen = []

    class Record(ModelHook):  # chained after the dispatch hook: sees what the forward sees
        def pre_forward(self, module, *args, **kwargs):
            seen.append(module.weight.device.type)
            return args, kwargs

    add_hook_to_module(model.blocks[3].fc1, Record(), append=True)
    assert model.blocks[3].fc1.weight.device.type == "meta"
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=1e-5)
    assert seen == ["cpu"]  # materialized on the execution device for the forward ...
    assert all(p.device.type == "meta" for p in model.parameters())  # ... and released after it
    assert model.scale.device.type == "cpu"  # buffers stay on the execution device (offload_buffers=False)


def test_dtype_conversion_writes_converted_weights_to_the_offload_folder(reference, tmp_path):
    plain, ids, _ = reference
    checkpoint = write_checkpoint(plain, tmp_path, "file")
    model = load_checkpoint_and_dispatch(empty_net(), checkpoint, device_map={"": "cpu", "blocks": "disk"},
                                         offload_folder=tmp_path / "offload", dtype=torch.bfloat16)
    index = json.loads((tmp_path / "offload" / "index.json").read_text())
    assert index["blocks.0.fc1.weight"] == {"dtype": "bfloat16", "shape": [64, 32]}
    assert (tmp_path / "offload" / "blocks.0.fc1.weight.dat").stat().st_size == 64 * 32 * 2
    assert model.scale.dtype == torch.float32  # a buffer built by the model (not in the checkpoint) keeps its dtype
    model.scale = model.scale.to(torch.bfloat16)
    expected = plain.to(torch.bfloat16)
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected(ids), rtol=0, atol=1e-5)


def test_cpu_offload_and_disk_offload_of_a_built_model(reference, tmp_path):
    plain, ids, expected = reference
    for offload in (lambda m: cpu_offload(m, execution_device="cpu"),
                    lambda m: disk_offload(m, tmp_path / "disk", execution_device="cpu")):
        model = Net().eval()
        model.load_state_dict(plain.state_dict())
        offload(model)
        assert all(p.device.type == "meta" for p in model.parameters())
        with torch.no_grad():
            torch.testing.assert_close(model(ids), expected, rtol=0, atol=1e-5)
    index = json.loads((tmp_path / "disk" / "index.json").read_text())
    assert "head.weight" not in index and set(index) == {n for n, _ in plain.named_parameters()}
    dispatch_model(model, {"": "cpu"})  # dispatched again: back in memory, no hooks left
    assert all(p.device.type == "cpu" for p in model.parameters()) and not hasattr(model.blocks[0].fc1, "_hf_hook")
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=1e-5)


def test_forced_hooks_move_inputs_and_bring_outputs_back(reference):
    plain, ids, expected = reference
    model = Net().eval()
    model.load_state_dict(plain.state_dict())
    dispatch_model(model, {"": "cpu", "blocks.3": "cpu"}, force_hooks=True)
    assert hasattr(model, "_hf_hook") and hasattr(model.blocks[3], "_hf_hook")
    with torch.no_grad():
        torch.testing.assert_close(model(ids), expected, rtol=0, atol=1e-5)
    remove_hooks(model)
    assert not hasattr(model, "_hf_hook") and not hasattr(model.blocks[3], "_hf_hook")
    assert "forward" not in model.__dict__  # the class's own forward again


class UsesChildWeight(nn.Module):
    """Reads its child's weight directly (like nn.MultiheadAttention does with out_proj)."""

    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return nn.functional.linear(x, self.proj.weight, self.proj.bias)


def test_preload_module_classes_load_a_whole_subtree(tmp_path):
    torch.manual_seed(0)
    plain = nn.Sequential(UsesChildWeight(), nn.Linear(8, 2))
    x = torch.randn(3, 8)
    expected = plain(x).detach()
    model = nn.Sequential(UsesChildWeight(), nn.Linear(8, 2))
    model.load_state_dict(plain.state_dict())
    disk_offload(model, tmp_path / "a", execution_device="cpu")
    with pytest.raises((RuntimeError, NotImplementedError)):  # the child's own hook never runs
        model(x)
    model = nn.Sequential(UsesChildWeight(), nn.Linear(8, 2))
    model.load_state_dict(plain.state_dict())
    disk_offload(model, tmp_path / "b", execution_device="cpu", preload_module_classes=["UsesChildWeight"])
    torch.testing.assert_close(model(x), expected, rtol=0, atol=1e-6)


def test_safetensors_reader_matches_safetensors(tmp_path):
    tensors = {f"t_{dtype}".replace("torch.", ""): (torch.randn(3, 5) * 50).to(dtype)
               for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int8,
                             torch.uint8, torch.bool)}
    tensors["scalar"], tensors["empty"] = torch.tensor(3.5), torch.zeros(0, 4)
    save_file(tensors, tmp_path / "x.safetensors")
    records = read_safetensors_index(tmp_path / "x.safetensors")
    expected = load_file(tmp_path / "x.safetensors")
    assert set(records) == set(expected)
    for name, tensor in expected.items():
        got = records[name].read()
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name


def test_checkpoint_keys_must_match(reference, tmp_path, caplog):
    plain = reference[0]
    state = {k: v for k, v in plain.state_dict().items() if k != "head.weight"}
    save_file({k: v for k, v in state.items() if k != "blocks.2.fc1.bias"}, tmp_path / "missing.safetensors")
    with pytest.raises(CheckpointError, match=r"1 tensor\(s\) of the model are not in it, e\.g\. \['blocks\.2\.fc1\.bias'\]"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "missing.safetensors", device_map={"": "cpu"})
    save_file({f"model.{k}": v for k, v in state.items()}, tmp_path / "prefixed.safetensors")
    with pytest.raises(CheckpointError, match="the checkpoint's names start with 'model.'"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "prefixed.safetensors", device_map={"": "cpu"})
    save_file({**state, "blocks.0.fc1.weight": torch.zeros(3, 3)}, tmp_path / "shape.safetensors")
    with pytest.raises(CheckpointError, match=r"'blocks\.0\.fc1\.weight' has shape \[3, 3\] in the checkpoint, but \[64, 32\]"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "shape.safetensors", device_map={"": "cpu"})
    save_file({**state, "extra.weight": torch.zeros(2)}, tmp_path / "extra.safetensors")
    with caplog.at_level("WARNING", logger="acc.big_model.dispatch"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "extra.safetensors", device_map={"": "cpu"})
    assert any(r"1 tensor(s) of checkpoint" in r.message and "were not used when initializing Net" in r.message
               and "extra.weight" in r.message for r in caplog.records), caplog.text
    with pytest.raises(CheckpointError, match=r"not in the model, e\.g\. \['extra\.weight'\]"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "extra.safetensors", device_map={"": "cpu"},
                                     strict=True)
    (tmp_path / "model.bin").write_bytes(b"x")
    with pytest.raises(CheckpointError, match="not a torch state dict that loads with weights_only=True"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "model.bin")
    (tmp_path / "model.npz").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"not a checkpoint acc reads: a \.safetensors file, a torch state dict"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "model.npz")


class _NotATensor:
    def __reduce__(self):
        return (print, ("this must never run",))


def test_torch_checkpoints_load_with_the_restricted_unpickler(reference, tmp_path, capsys):
    state = reference[0].state_dict()
    torch.save(state, tmp_path / "pytorch_model.bin")
    loaded = load_checkpoint_and_dispatch(empty_net(), tmp_path, device_map={"": "cpu"})
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    # a sharded torch checkpoint through a bare {tensor: file} index, as Accelerate's tests write them
    names = sorted(state)
    half = len(names) // 2
    torch.save({k: state[k] for k in names[:half]}, tmp_path / "part1.bin")
    torch.save({k: state[k] for k in names[half:]}, tmp_path / "part2.bin")
    index = {k: ("part1.bin" if i < half else "part2.bin") for i, k in enumerate(names)}
    (tmp_path / "weights.index.json").write_text(__import__("json").dumps(index))
    loaded = load_checkpoint_and_dispatch(empty_net(), tmp_path / "weights.index.json", device_map={"": "cpu"})
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in state.items())
    torch.save({"weight": _NotATensor()}, tmp_path / "evil.pt")
    with pytest.raises(CheckpointError, match="weights_only=True"):
        load_checkpoint_and_dispatch(empty_net(), tmp_path / "evil.pt", device_map={"": "cpu"})
    assert "this must never run" not in capsys.readouterr().out


def test_acc_checkpoint_is_verified_before_loading(reference, tmp_path, fresh_pm):
    directory = write_checkpoint(reference[0], tmp_path, "acc", fresh_pm)
    path = directory / "model_0.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match="corrupt"):
        load_checkpoint_and_dispatch(empty_net(), directory, device_map={"": "cpu"})


# ---------------------------------------------------------------------------------------------- 1.2 GB model


class BigNet(nn.Module):
    """18 blocks of 2048 -> 4096 -> 2048 (67 MB each): 1.21 GB of float32 weights."""

    def __init__(self, n: int = 18, d: int = 2048, h: int = 4096):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d, h) for _ in range(n))
        self.head = nn.Linear(d, 16)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def write_big_checkpoint(directory: Path) -> int:
    """BigNet's weights as one safetensors shard per block plus an index, written block by block (the
    test process never holds more than one block). Returns the total bytes."""
    directory.mkdir()
    with torch.device("meta"):
        shapes = {k: v.shape for k, v in BigNet().state_dict().items()}
    groups: dict[str, dict[str, torch.Size]] = {}
    for name, shape in shapes.items():
        groups.setdefault(".".join(name.split(".")[:2]) if name.startswith("blocks.") else "head", {})[name] = shape
    weight_map, total = {}, 0
    for i, (group, members) in enumerate(groups.items()):
        generator = torch.Generator().manual_seed(i)
        shard = {name: torch.empty(shape).uniform_(-0.03, 0.03, generator=generator) for name, shape in members.items()}
        file = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        save_file(shard, directory / file)
        weight_map.update(dict.fromkeys(shard, file))
        total += sum(t.numel() * 4 for t in shard.values())
        del shard
    (directory / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                        "weight_map": weight_map}))
    return total


CHILD_HEADER = """
import json, resource, sys, time
import torch
from torch import nn
from safetensors.torch import load_file, save_file

def peak_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB

x = torch.randn(4, 2048, generator=torch.Generator().manual_seed(123))
checkpoint, out = sys.argv[1], sys.argv[2]
"""

DISPATCHED = """
from acc.big_model import init_empty_weights, load_checkpoint_and_dispatch
start = time.perf_counter()
imported = peak_mb()
with init_empty_weights():
    model = BigNet().eval()
model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", max_memory={"cpu": "400MB"},
                                     no_split_module_classes=["Block"], offload_folder=out + ".offload")
loaded = peak_mb()
resident = sum(p.numel() * p.element_size() for p in model.parameters() if not p.is_meta)
with torch.no_grad():
    y = model(x)
save_file({"y": y}, out)
print("RESULT " + json.dumps({"imported_mb": imported, "loaded_mb": loaded, "peak_mb": peak_mb(),
                              "resident_bytes": resident, "seconds": time.perf_counter() - start,
                              "places": sorted(set(map(str, model.hf_device_map.values())))}))
"""

PLAIN = """
import os
with torch.device("meta"):
    model = BigNet().eval()
index = json.load(open(os.path.join(checkpoint, "model.safetensors.index.json")))
state = {}
for shard in sorted(set(index["weight_map"].values())):
    state.update(load_file(os.path.join(checkpoint, shard)))
model.load_state_dict(state, assign=True)
with torch.no_grad():
    y = model(x)
save_file({"y": y}, out)
"""


def run_child(body: str, checkpoint: Path, out: Path, tmp_path: Path) -> str:
    source = CHILD_HEADER + textwrap.dedent(inspect.getsource(Block)) + textwrap.dedent(inspect.getsource(BigNet)) + body
    script = tmp_path / f"{out.stem}.py"
    script.write_text(source)
    proc = subprocess.run([sys.executable, str(script), str(checkpoint), str(out)], capture_output=True, text=True,
                          timeout=300, env=clean_env(tmp_path), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout


@pytest.mark.slow
def test_a_1_2_gb_model_runs_with_400_mb_of_cpu_and_the_rest_on_disk_under_1_gb_rss(tmp_path):
    total = write_big_checkpoint(tmp_path / "big")
    assert 1.15e9 < total < 1.3e9
    report = run_child(DISPATCHED, tmp_path / "big", tmp_path / "dispatched.safetensors", tmp_path)
    result = json.loads(next(line[7:] for line in report.splitlines() if line.startswith("RESULT ")))
    print(f"\n1.2 GB model, 400 MB CPU budget: {result}")
    assert result["places"] == ["cpu", "disk"]
    assert 0 < result["resident_bytes"] <= 400 * MB
    assert result["peak_mb"] * 2**20 < 1e9, result  # the whole process, torch included
    run_child(PLAIN, tmp_path / "big", tmp_path / "plain.safetensors", tmp_path)  # no memory limit here
    got, expected = load_file(tmp_path / "dispatched.safetensors")["y"], load_file(tmp_path / "plain.safetensors")["y"]
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert expected.abs().max() > 0.1  # a real signal, not zeros
