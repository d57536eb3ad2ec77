"""save_state/load_state on one process: round trip, crash safety, naming, corruption, safety, save_model."""

from __future__ import annotations

import json
import pickle
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, DataLoaderConfiguration, set_seed
from acc.checkpointing.files import ProjectConfiguration, digest
from acc.errors import CheckpointError


class Counter:
    def __init__(self):
        self.count = 0

    def state_dict(self):
        return {"count": self.count}

    def load_state_dict(self, state):
        self.count = state["count"]


def setup(fresh_pm, tmp_path: Path, **kwargs):
    set_seed(1)
    acc = Accelerator(plugin_manager=fresh_pm, **kwargs)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    sched = torch.optim.lr_scheduler.StepLR(opt, 2, 0.5)
    data = TensorDataset(torch.randn(40, 4), torch.randint(0, 2, (40,)), torch.arange(40))
    loader = DataLoader(data, batch_size=4, shuffle=True)
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    return acc, model, opt, sched, loader, counter


def train(acc, model, opt, sched, loader, counter, steps: int) -> list[list[int]]:
    seen = []
    while len(seen) < steps:
        for x, y, idx in loader:
            acc.backward(nn.functional.cross_entropy(model(x), y))
            opt.step()
            sched.step()
            opt.zero_grad()
            counter.count += 1
            seen.append(idx.tolist())
            if len(seen) == steps:
                break
    return seen


def state_of(model, opt) -> list[torch.Tensor]:
    tensors = [p.detach().clone() for p in model.parameters()]
    for s in opt.state_dict()["state"].values():
        tensors += [s["exp_avg"].clone(), s["exp_avg_sq"].clone()]
    return tensors


@pytest.mark.parametrize("how", [{"semantics": "acc"},
                                 {"dataloader_config": DataLoaderConfiguration(use_stateful_dataloader=True)}])
def test_exact_resume_mid_epoch_is_bitwise_identical(fresh_pm, tmp_path, how):
    """resume_data_position (acc's semantics, or Accelerate's use_stateful_dataloader spelling): the data
    continue with the next batch, so saved after 7 and resumed for 10 equals 17 straight."""
    straight = setup(fresh_pm, tmp_path, **how)
    seen_straight = train(*straight, steps=17)
    random_after_straight = torch.rand(3)
    first = setup(fresh_pm, tmp_path, **how)
    seen_a = train(*first, steps=7)
    first[0].save_state(tmp_path / "ckpt")
    second = setup(fresh_pm, tmp_path, **how)
    torch.manual_seed(12345)  # a different random stream: load_state must restore it
    second[0].load_state(tmp_path / "ckpt")
    assert second[5].count == 7 and second[0].applied_steps == 7
    seen_b = train(*second, steps=10)
    assert torch.equal(torch.rand(3), random_after_straight)  # the random stream continued where it was saved
    assert seen_a + seen_b == seen_straight
    assert all(torch.equal(a, b) for a, b in zip(state_of(straight[1], straight[2]), state_of(second[1], second[2])))
    assert straight[3].get_last_lr() == second[3].get_last_lr()


def test_default_resume_restarts_the_epoch_and_says_so_once(fresh_pm, tmp_path, capsys):
    """Accelerate's semantics: load_state restores model, optimizer, scheduler, RNG and counters, not the data
    position; a checkpoint saved mid-epoch says so in one line."""
    first = setup(fresh_pm, tmp_path)
    train(*first, steps=7)
    first[0].save_state(tmp_path / "ckpt")
    second = setup(fresh_pm, tmp_path)
    capsys.readouterr()
    second[0].load_state(tmp_path / "ckpt")
    lines = [line for line in capsys.readouterr().err.splitlines() if "saved after batch" in line]
    assert len(lines) == 1 and "after batch 7 of epoch 0" in lines[0] and "resume_data_position" in lines[0]
    assert second[0].applied_steps == 7 and second[5].count == 7
    assert all(torch.equal(a, b) for a, b in zip(state_of(first[1], first[2]), state_of(second[1], second[2])))
    assert second[4].position() == (0, 0)  # the loader starts its epoch again


def test_checkpoint_layout_and_manifest(fresh_pm, tmp_path):
    acc, *_ = setup(fresh_pm, tmp_path)
    directory = acc.save_state(tmp_path / "c")
    manifest = json.loads((directory / "manifest.json").read_text())
    assert manifest["format"] == "acc-checkpoint/2"
    assert set(manifest["files"]) == {"model_0.safetensors", "optimizer_0.pt", "kernel_state.pt", "custom_0.pt",
                                      "rng_state_0.pt"}
    for name, entry in manifest["files"].items():
        assert digest(directory / name) == entry
    run = manifest["run"]
    assert run["backend"] == "cpu" and run["processes"]["num_processes"] == 1
    assert run["batch_sizes"] == [{"per_process": 4, "global": 4}]
    assert "torch" in run["versions"] and "acc-core" in run["versions"]
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temporary directory left


def test_automatic_naming_keeps_the_newest_and_loads_the_newest(fresh_pm, tmp_path):
    config = ProjectConfiguration(project_dir=str(tmp_path / "proj"), automatic_checkpoint_naming=True, total_limit=2)
    acc, model, opt, sched, loader, counter = setup(fresh_pm, tmp_path, project_config=config)
    for i in range(4):
        counter.count = i
        acc.save_state()
    names = sorted(p.name for p in (tmp_path / "proj" / "checkpoints").iterdir())
    assert names == ["checkpoint_2", "checkpoint_3"]
    # an incomplete save (a crash left its temporary directory) is never picked
    (tmp_path / "proj" / "checkpoints" / ".checkpoint_4.tmp-dead").mkdir()
    (tmp_path / "proj" / "checkpoints" / "checkpoint_9").mkdir()  # no manifest: not complete
    config2 = ProjectConfiguration(project_dir=str(tmp_path / "proj"), automatic_checkpoint_naming=True)
    acc2, _, _, _, _, counter2 = setup(fresh_pm, tmp_path, project_config=config2)
    assert acc2.load_state() == tmp_path / "proj" / "checkpoints" / "checkpoint_3"
    assert counter2.count == 3 and config2.iteration == 4


def test_register_for_checkpointing_needs_state_dict(fresh_pm, tmp_path):
    acc, *_ = setup(fresh_pm, tmp_path)
    before = list(acc._custom_objects)
    with pytest.raises(ValueError, match=r"Item at index 1 \(int\) lack\(s\) state_dict\(\) and load_state_dict\(\)"):
        acc.register_for_checkpointing(Counter(), 5)
    assert acc._custom_objects == before  # nothing of the call was registered


def saved(fresh_pm, tmp_path) -> tuple[Path, tuple]:
    objs = setup(fresh_pm, tmp_path)
    return objs[0].save_state(tmp_path / "c"), objs


def test_truncated_file_is_refused_naming_it(fresh_pm, tmp_path):
    directory, objs = saved(fresh_pm, tmp_path)
    path = directory / "optimizer_0.pt"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=r"optimizer_0.pt: truncated or altered: 100 bytes, the manifest says"):
        objs[0].load_state(directory)


def test_corrupt_file_is_refused_naming_it(fresh_pm, tmp_path):
    directory, objs = saved(fresh_pm, tmp_path)
    path = directory / "model_0.safetensors"
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(CheckpointError, match=r"model_0.safetensors: corrupt: its blake3 checksum differs"):
        objs[0].load_state(directory)


def test_directory_without_manifest_is_not_a_checkpoint(fresh_pm, tmp_path):
    directory, objs = saved(fresh_pm, tmp_path)
    (directory / "manifest.json").unlink()
    with pytest.raises(CheckpointError, match="is not a complete acc checkpoint: it has no manifest.json"):
        objs[0].load_state(directory)
    with pytest.raises(CheckpointError, match="does not exist"):
        objs[0].load_state(tmp_path / "nowhere")


def _rewrite(directory: Path, name: str, data: bytes) -> None:
    (directory / name).write_bytes(data)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["files"][name] = digest(directory / name)
    (directory / "manifest.json").write_text(json.dumps(manifest))


class Evil:
    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(EVIL_MARK),))


EVIL_MARK = ""


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(fresh_pm, tmp_path):
    global EVIL_MARK
    EVIL_MARK = str(tmp_path / "pwned")
    directory, objs = saved(fresh_pm, tmp_path)
    _rewrite(directory, "optimizer_0.pt", pickle.dumps({"state": Evil()}))  # manifest updated: checksums pass
    with pytest.raises(CheckpointError, match="optimizer_0.pt: refused: the file holds Python objects"):
        objs[0].load_state(directory)
    assert not (tmp_path / "pwned").exists()
    pickle.loads(pickle.dumps(Evil()))  # control: plain unpickling would have run it
    assert (tmp_path / "pwned").exists()


def test_a_foreign_file_is_refused(fresh_pm, tmp_path):
    directory, objs = saved(fresh_pm, tmp_path)
    _rewrite(directory, "model_0.safetensors", b"this is not a safetensors file at all")
    with pytest.raises(CheckpointError, match="model_0.safetensors: not a readable safetensors file"):
        objs[0].load_state(directory)


def test_a_checkpoint_of_another_model_is_refused(fresh_pm, tmp_path):
    directory, _ = saved(fresh_pm, tmp_path)
    acc = Accelerator(plugin_manager=fresh_pm)
    model = nn.Linear(3, 3)
    acc.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(CheckpointError, match="model_0.safetensors: does not fit model #0 \\(Linear\\)"):
        acc.load_state(directory)


def test_world_size_difference_is_warned_about(fresh_pm, tmp_path):
    directory, objs = saved(fresh_pm, tmp_path)
    manifest = json.loads((directory / "manifest.json").read_text())
    manifest["run"]["processes"]["num_processes"] = 2
    (directory / "manifest.json").write_text(json.dumps(manifest))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        objs[0].load_state(directory)
    assert any("saved by 2 process(es); this run has 1" in str(w.message) and "RNG states are not restored"
               in str(w.message) for w in caught)


def test_save_model_writes_safetensors_that_load_strictly(fresh_pm, tmp_path):
    acc, model, *_ = setup(fresh_pm, tmp_path)
    acc.save_model(model, tmp_path / "m")
    plain = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    plain.load_state_dict(load_file(str(tmp_path / "m" / "model.safetensors")), strict=True)
    assert torch.equal(plain[0].weight, acc.unwrap_model(model)[0].weight)


def test_save_model_shards_with_an_index(fresh_pm, tmp_path):
    acc = Accelerator(plugin_manager=fresh_pm)
    model = acc.prepare(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))
    acc.save_model(model, tmp_path / "m", max_shard_size="20KB")  # each layer ~16.6 KB
    index = json.loads((tmp_path / "m" / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) == 4 and shards[0] == "model-00001-of-00004.safetensors"
    merged = {}
    for name in shards:
        merged.update(load_file(str(tmp_path / "m" / name)))
    fresh = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    fresh.load_state_dict(merged, strict=True)
    assert index["metadata"]["total_size"] == sum(t.numel() * 4 for t in merged.values())


@pytest.mark.parametrize("shard", [None, "20KB"])
def test_save_model_without_safe_serialization_writes_accelerates_torch_files(fresh_pm, tmp_path, shard):
    from acc.big_modeling import load_checkpoint_in_model

    acc = Accelerator(plugin_manager=fresh_pm)
    model = acc.prepare(nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)]))
    acc.save_model(model, tmp_path / "m", safe_serialization=False, **({"max_shard_size": shard} if shard else {}))
    names = sorted(p.name for p in (tmp_path / "m").iterdir())
    if shard is None:
        assert names == ["pytorch_model.bin"]
    else:
        assert names == [f"pytorch_model-0000{i}-of-00004.bin" for i in range(1, 5)] + ["pytorch_model.bin.index.json"]
    fresh = nn.Sequential(*[nn.Linear(64, 64) for _ in range(4)])
    load_checkpoint_in_model(fresh, str(tmp_path / "m"))
    assert all(torch.equal(a, b) for a, b in zip(fresh.state_dict().values(), model.state_dict().values()))


def test_save_model_reads_an_offloaded_models_weights_back(fresh_pm, tmp_path):
    from acc.big_modeling import cpu_offload

    acc = Accelerator(plugin_manager=fresh_pm)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    cpu_offload(model, execution_device="cpu")
    assert all(p.is_meta for p in model.parameters())
    acc.save_model(model, tmp_path / "m")
    saved = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert saved.keys() == expected.keys() and all(torch.equal(saved[k], expected[k]) for k in expected)


def test_tied_weights_are_saved_and_reload(fresh_pm, tmp_path):
    acc = Accelerator(plugin_manager=fresh_pm)
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 10, bias=False))
    model[1].weight = model[0].weight
    model = acc.prepare(model)
    acc.save_model(model, tmp_path / "m")
    state = load_file(str(tmp_path / "m" / "model.safetensors"))
    assert torch.equal(state["0.weight"], state["1.weight"])


def test_save_writes_on_the_main_process(fresh_pm, tmp_path):
    acc = Accelerator(plugin_manager=fresh_pm)
    acc.save({"a": torch.ones(2)}, tmp_path / "x" / "obj.pt")
    assert torch.equal(torch.load(tmp_path / "x" / "obj.pt", weights_only=True)["a"], torch.ones(2))


def test_save_and_load_hooks_can_take_a_model_over(fresh_pm, tmp_path):
    """diffusers' pattern: the save hook writes the model itself and pops its weights; the load hook loads it
    itself and pops it from the list, so acc neither writes nor reads that model."""
    acc, model, opt, *_ = setup(fresh_pm, tmp_path)
    calls = []

    def save_hook(models, weights, output_dir):
        calls.append(("save", len(models), len(weights), Path(output_dir).name.split(".tmp-")[0]))
        for m in models:  # written into the checkpoint's directory: published with it
            torch.save(acc.unwrap_model(m).state_dict(), Path(output_dir) / "own_weights.pt")
            weights.pop()

    def load_hook(models, input_dir):
        calls.append(("load", len(models), Path(input_dir).name))
        while models:
            m = models.pop()
            acc.unwrap_model(m).load_state_dict(torch.load(Path(input_dir) / "own_weights.pt"))

    handles = [acc.register_save_state_pre_hook(save_hook), acc.register_load_state_pre_hook(load_hook)]
    saved = {k: v.clone() for k, v in acc.unwrap_model(model).state_dict().items()}
    directory = acc.save_state(tmp_path / "c")
    files = json.loads((directory / "manifest.json").read_text())["files"]
    assert "model_0.safetensors" not in files and "own_weights.pt" in files
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    acc.load_state(directory)
    assert calls == [("save", 1, 1, ".c"), ("load", 1, "c")]
    assert all(torch.equal(saved[k], v) for k, v in acc.unwrap_model(model).state_dict().items())
    for handle in handles:
        handle.remove()
    acc.save_state(tmp_path / "d")  # without hooks, acc writes the model again
    assert "model_0.safetensors" in json.loads((tmp_path / "d" / "manifest.json").read_text())["files"]
    assert len(calls) == 2


def test_save_on_each_node_is_refused_across_machines_only(fresh_pm, tmp_path, monkeypatch):
    acc, *_ = setup(fresh_pm, tmp_path, project_config=ProjectConfiguration(save_on_each_node=True))
    acc.save_state(tmp_path / "one-machine")  # one machine: nothing changes
    acc.ctx.settings = acc.ctx.settings.override("num_machines", 2, "test")
    with pytest.raises(CheckpointError, match="save_on_each_node=True.*2 machines"):
        acc.save_state(tmp_path / "two")


def test_a_prepared_optimizer_pickles_and_comes_back_working_in_this_process(fresh_pm):
    import pickle

    import torch

    from acc import Accelerator

    accelerator = Accelerator(plugin_manager=fresh_pm)
    model = torch.nn.Linear(3, 1)
    model, optimizer = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    copy = pickle.loads(pickle.dumps(optimizer))
    assert copy.optimizer.param_groups[0]["lr"] == 0.1
    accelerator.backward(model(torch.ones(2, 3)).sum())
    before = model.weight.detach().clone()
    optimizer.step()
    assert not torch.equal(before, model.weight)


def test_get_logger_records_the_callers_line(caplog):
    import inspect

    from acc.logging import get_logger

    with caplog.at_level("WARNING"):
        line = inspect.currentframe().f_lineno + 1
        get_logger("acc.test.caller").warning("where am I")
    record = caplog.records[-1]
    assert record.pathname == __file__ and record.lineno == line, (record.pathname, record.lineno)


def test_a_stacklevel_given_to_get_logger_counts_from_its_adapter(caplog):
    import inspect
    import logging

    from acc.logging import get_logger

    class Wrapper(logging.LoggerAdapter):  # a user's wrapper that names its own caller's line
        def log(self, level, msg, *args, **kwargs):
            kwargs["stacklevel"] = 3
            self.logger.log(level, msg, *args, **kwargs)

    with caplog.at_level("WARNING"):
        line = inspect.currentframe().f_lineno + 1
        Wrapper(get_logger("acc.test.wrapped"), {}).warning("wrapped")
    record = caplog.records[-1]
    assert record.pathname == __file__ and record.lineno == line, (record.pathname, record.lineno)


def test_an_accelerate_checkpoint_missing_a_file_is_refused_naming_it(fresh_pm, tmp_path):
    from safetensors.torch import save_file

    acc, model, *_ = setup(fresh_pm, tmp_path)
    ckpt = tmp_path / "accelerate_ckpt"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in acc.unwrap_model(model).state_dict().items()}, str(ckpt / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"Accelerate checkpoint without optimizer\.bin for optimizer #0"):
        acc.load_state(ckpt)
