"""acc.utils helpers with Accelerate's signatures: each one's behaviour (single process; the multi-process ones
are in tests/plugins/ddp/test_comm_hook_local_sgd.py and tests/plugins/fsdp/test_merge_fsdp_weights.py)."""

from __future__ import annotations

import collections
import gc
import io
import os
import pickle
import sys
import weakref

import pytest
import torch
from safetensors.torch import load_file, save_file
from torch import nn

from acc.utils import (
    ComputeEnvironment,
    DDPCommunicationHookType,
    DistributedDataParallelKwargs,
    DynamoBackend,
    LoggerType,
    PrecisionType,
    RNGType,
    clear_environment,
    compare_versions,
    convert_outputs_to_fp32,
    extract_model_from_parallel,
    find_batch_size,
    find_executable_batch_size,
    find_tied_parameters,
    get_max_layer_size,
    get_pretty_name,
    honor_type,
    is_compiled_module,
    is_torch_version,
    listify,
    load,
    load_state_dict,
    patch_environment,
    recursively_apply,
    release_memory,
    save,
    set_module_tensor_to_device,
    tqdm,
    write_basic_config,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


# ---------------------------------------------------------------------------------------------- memory


def oom(size: int) -> torch.OutOfMemoryError:
    return torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {size} MiB (GPU 0; 1.00 GiB total capacity)")


def test_find_executable_batch_size_retries_smaller_after_out_of_memory_errors():
    tried = []

    @find_executable_batch_size(starting_batch_size=128)
    def train(batch_size, scale, *, offset=0):
        tried.append(batch_size)
        if batch_size > 50:
            raise oom(batch_size)
        return batch_size * scale + offset

    assert train(2, offset=1) == 46 * 2 + 1
    expected = [128]
    while expected[-1] > 50:
        expected.append(int(expected[-1] * 0.9))  # Accelerate 1.15's back-off
    assert tried == expected and tried[-1] == 46
    assert train(3) == 46 * 3 and tried[-1] == 46  # the size that worked is kept


def test_find_executable_batch_size_recognises_cpu_oom_and_custom_reduction():
    tried = []
    sizes = iter([64, 16, 4])

    @find_executable_batch_size(starting_batch_size=256, reduce_batch_size_fn=lambda: next(sizes))
    def run(batch_size):
        tried.append(batch_size)
        if batch_size > 10:
            raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate "
                               f"memory: you tried to allocate {batch_size * 2**30} bytes.")
        return batch_size

    assert run() == 4 and tried == [256, 64, 16, 4]


def test_find_executable_batch_size_passes_other_errors_through_and_stops_at_zero():
    calls = []

    @find_executable_batch_size(starting_batch_size=8)
    def broken(batch_size):
        calls.append(batch_size)
        raise ValueError("a bug, not memory")

    with pytest.raises(ValueError, match="a bug"):
        broken()
    assert calls == [8]

    @find_executable_batch_size(starting_batch_size=4)
    def never_fits(batch_size):
        raise oom(batch_size)

    with pytest.raises(RuntimeError, match="No executable batch size found, reached zero"):
        never_fits()

    @find_executable_batch_size(starting_batch_size=4)
    def fine(batch_size, x):
        return batch_size

    with pytest.raises(TypeError, match="Batch size was passed into `fine` as the first argument"):
        fine(4, 1)  # the decorator passes batch_size itself


def test_release_memory_returns_nones_and_collects_garbage():
    class Node:
        pass

    gc.disable()
    try:
        cycle = Node()
        cycle.me = cycle  # freed only by the garbage collector
        alive = weakref.ref(cycle)
        del cycle
        a, b = torch.ones(4), torch.zeros(2)
        tensor_ref = weakref.ref(a)
        assert alive() is not None
        a, b = release_memory(a, b)
        assert (a, b) == (None, None) and tensor_ref() is None
        assert alive() is None  # release_memory ran gc.collect()
    finally:
        gc.enable()


# ---------------------------------------------------------------------------------------------- environment


def test_patch_environment_sets_upper_case_strings_and_restores(monkeypatch):
    monkeypatch.setenv("ACCTEST_KEEP", "old")
    monkeypatch.delenv("ACCTEST_NEW", raising=False)
    with patch_environment(acctest_keep=1, ACCTEST_NEW=2.5):
        assert os.environ["ACCTEST_KEEP"] == "1" and os.environ["ACCTEST_NEW"] == "2.5"
    assert os.environ["ACCTEST_KEEP"] == "old" and "ACCTEST_NEW" not in os.environ
    with pytest.raises(KeyError):
        with patch_environment(acctest_new="x"):
            raise KeyError("inside")
    assert "ACCTEST_NEW" not in os.environ


def test_clear_environment_empties_and_restores(monkeypatch):
    monkeypatch.setenv("ACCTEST_FOO", "bar")
    with clear_environment():
        assert dict(os.environ) == {}
        os.environ["ACCTEST_FOO"] = "new_bar"
        os.environ["ACCTEST_ADDED"] = "1"
    assert os.environ["ACCTEST_FOO"] == "bar" and "ACCTEST_ADDED" not in os.environ
    assert "PATH" in os.environ


# ---------------------------------------------------------------------------------------------- config


def test_write_basic_config_writes_what_acc_config_default_writes(tmp_path, monkeypatch):
    from click.testing import CliRunner

    from acc.cli import cli

    monkeypatch.setenv("ACC_HARDWARE", '{"cuda": 4}')  # detection: 4 GPUs -> ddp, 4 processes
    by_cli = tmp_path / "cli.toml"
    result = CliRunner().invoke(cli, ["config", "--config-file", str(by_cli), "default"], prog_name="acc")
    assert result.exit_code == 0, result.output
    written = write_basic_config(save_location=tmp_path / "api.toml")
    assert written == tmp_path / "api.toml"
    assert written.read_text() == by_cli.read_text()
    data = tomllib.loads(written.read_text())
    assert data == {"backend": "ddp", "nproc": 4}


def test_write_basic_config_adds_mixed_precision_and_never_overwrites(tmp_path, monkeypatch, capsys):
    from acc.assembly.choose import assemble
    from acc.assembly.config_files import user_config_path

    monkeypatch.setenv("ACC_HARDWARE", '{"cuda": 0}')
    path = write_basic_config(mixed_precision="bf16")  # Accelerate's default location: acc's user file
    assert path == user_config_path() and path.exists()
    assert tomllib.loads(path.read_text()) == {"backend": "cpu", "mixed_precision": "bf16"}
    resolved = assemble(detect=True).settings
    assert resolved["mixed_precision"] == "bf16" and resolved.source("mixed_precision").startswith("user file")
    before = path.read_text()
    assert write_basic_config(mixed_precision="fp16") is False
    assert path.read_text() == before and "will not override" in capsys.readouterr().out
    with pytest.raises(ValueError, match="one of 'no', 'fp16' or 'bf16'"):
        write_basic_config(mixed_precision="fp8", save_location=tmp_path / "x.toml")
    assert not (tmp_path / "x.toml").exists()


# ---------------------------------------------------------------------------------------------- tqdm


@pytest.mark.parametrize("local_rank,main_only,shown", [("0", True, True), ("1", True, False), ("1", False, True)])
def test_tqdm_shows_on_the_local_main_process_only(monkeypatch, local_rank, main_only, shown):
    monkeypatch.setenv("RANK", str(int(local_rank) + 2))
    monkeypatch.setenv("LOCAL_RANK", local_rank)
    out = io.StringIO()
    bar = tqdm(range(3), main_process_only=main_only, file=out)
    assert bar.disable is (not shown)
    assert list(bar) == [0, 1, 2]
    assert ("3/3" in out.getvalue()) is shown


def test_tqdm_refuses_a_bool_first_argument_and_keeps_disable():
    with pytest.raises(ValueError, match="main_process_only"):
        tqdm(True, range(2))
    assert tqdm(range(2), disable=True, file=io.StringIO()).disable is True


# ---------------------------------------------------------------------------------------------- enums


def test_enums_have_accelerates_values_and_comparisons():
    assert [m.value for m in DDPCommunicationHookType] == ["no", "fp16", "bf16", "power_sgd", "batched_power_sgd"]
    assert LoggerType.list() == ["all", "aim", "tensorboard", "wandb", "trackio", "comet_ml", "mlflow", "clearml",
                                 "dvclive", "swanlab"]
    assert PrecisionType.list() == ["no", "fp8", "fp16", "bf16"] and PrecisionType.BF16 == "bf16"
    assert str(RNGType.CUDA) == "cuda" and "generator" in RNGType and "nope" not in RNGType
    assert DynamoBackend("INDUCTOR") is DynamoBackend.INDUCTOR and DynamoBackend.INDUCTOR == "INDUCTOR"
    assert ComputeEnvironment.LOCAL_MACHINE == "LOCAL_MACHINE"
    assert LoggerType.WANDB != "wandb" and DDPCommunicationHookType.FP16 != "fp16"  # plain enums there too
    assert str(LoggerType.TENSORBOARD) == "tensorboard"


def test_ddp_kwargs_keep_the_comm_hook_out_of_the_constructor_arguments():
    kwargs = DistributedDataParallelKwargs(find_unused_parameters=True, comm_hook=DDPCommunicationHookType.POWER_SGD,
                                           comm_wrapper="fp16", comm_state_option={"matrix_approximation_rank": 2})
    assert kwargs.to_kwargs() == {"find_unused_parameters": True}
    with pytest.raises(ValueError, match="comm_wrapper='power_sgd'"):
        DistributedDataParallelKwargs(comm_hook="fp16", comm_wrapper="power_sgd").register_comm_hook(object())
    DistributedDataParallelKwargs().register_comm_hook(object())  # "no": nothing is touched


# ---------------------------------------------------------------------------------------------- unwrapping


@pytest.fixture
def one_process_group():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_extract_model_from_parallel_unwraps_ddp_compile_and_the_autocast_forward(one_process_group):
    from acc.runtime.precision import Precision

    model = nn.Linear(4, 2)
    Precision("bf16", torch.device("cpu")).patch_forward(model)
    assert "forward" in model.__dict__
    ddp = nn.parallel.DistributedDataParallel(model)
    assert extract_model_from_parallel(ddp) is model and "forward" in model.__dict__  # fp32 wrapper kept
    compiled = torch.compile(ddp)
    assert is_compiled_module(compiled) and not is_compiled_module(ddp)
    kept = extract_model_from_parallel(compiled)
    assert kept is compiled and compiled._orig_mod is model  # still compiled, around the plain model
    compiled._orig_mod = ddp
    plain = extract_model_from_parallel(compiled, keep_fp32_wrapper=False, keep_torch_compile=False)
    assert plain is model and "forward" not in model.__dict__  # acc's autocast forward removed
    x = torch.randn(3, 4)
    assert plain(x).dtype == torch.float32


def test_extract_model_from_parallel_leaves_an_fsdp2_model_and_removes_convert_outputs_to_fp32(one_process_group):
    from torch.distributed.fsdp import FSDPModule, fully_shard

    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2))
    fully_shard(model)
    assert isinstance(model, FSDPModule) and extract_model_from_parallel(model) is model

    plain = nn.Linear(2, 2)
    plain._original_forward = plain.forward
    plain.forward = convert_outputs_to_fp32(plain.forward)
    assert extract_model_from_parallel(plain, keep_fp32_wrapper=False) is plain
    assert "forward" not in plain.__dict__ and "_original_forward" not in plain.__dict__


# ---------------------------------------------------------------------------------------------- small helpers


def test_versions():
    from packaging.version import Version

    assert is_torch_version("==", torch.__version__) and is_torch_version(">=", "2.0")
    assert not is_torch_version("<", "2.0")
    assert compare_versions("torch", ">", "1.0") and compare_versions(Version("1.2"), "<", "1.10")
    with pytest.raises(ValueError, match="`operation` must be one of"):
        compare_versions("torch", "~=", "2.0")


def test_get_pretty_name():
    assert get_pretty_name(nn.Linear) == "Linear" and get_pretty_name(nn.Linear(1, 1)) == "Linear"
    assert get_pretty_name(test_get_pretty_name) == "test_get_pretty_name"
    assert get_pretty_name(torch.optim.SGD.step).endswith("SGD.step")


def test_convert_outputs_to_fp32():
    def forward(x):
        return {"logits": x.half(), "ids": torch.arange(2), "pair": (x.bfloat16(), x)}

    wrapped = convert_outputs_to_fp32(forward)
    out = wrapped(torch.ones(2, dtype=torch.float64))
    assert out["logits"].dtype == torch.float32 and out["pair"][0].dtype == torch.float32
    assert out["ids"].dtype == torch.int64 and out["pair"][1].dtype == torch.float64
    assert wrapped.__wrapped__.model_forward is forward
    with pytest.raises(pickle.PicklingError, match="unwrap the model"):
        pickle.dumps(wrapped.__wrapped__)


Pair = collections.namedtuple("Pair", "a b")


def test_recursively_apply_honor_type_and_find_batch_size():
    data = {"x": [torch.ones(5, 2), Pair(torch.zeros(5), "label")], "n": 3}
    doubled = recursively_apply(lambda t, k: t * k, data, 2)
    assert isinstance(doubled["x"][1], Pair) and doubled["x"][1].b == "label" and doubled["n"] == 3
    assert torch.equal(doubled["x"][0], torch.full((5, 2), 2.0))
    with pytest.raises(TypeError, match="Unsupported types"):
        recursively_apply(lambda t: t, data, error_on_other_type=True)
    assert recursively_apply(str, [1, "a"], test_type=lambda o: isinstance(o, int)) == ["1", "a"]
    assert honor_type(Pair(1, 2), iter([3, 4])) == Pair(3, 4) and honor_type((1,), iter([5])) == (5,)
    assert find_batch_size(data) == 5 and find_batch_size([{"a": torch.ones(7, 1)}]) == 7
    with pytest.raises(ValueError, match="empty"):
        find_batch_size({})
    with pytest.raises(TypeError, match="Can only find the batch size of tensors"):
        find_batch_size(["text"])


def test_listify():
    out = listify({"a": torch.tensor([1.5, 2.0], dtype=torch.bfloat16), "b": (torch.tensor([[1, 2]]),)})
    assert out == {"a": [1.5, 2.0], "b": ([[1, 2]],)}


# ---------------------------------------------------------------------------------------------- modeling


class Tied(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.body = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 6))
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(4))


def test_find_tied_parameters_and_get_max_layer_size():
    from acc.big_model import compute_module_sizes

    model = Tied()
    assert find_tied_parameters(model) == [["embed.weight", "head.weight"]]
    assert find_tied_parameters(nn.Linear(2, 2)) == []
    sizes = compute_module_sizes(model)
    size, names = get_max_layer_size(list(model.named_children()), sizes, [])
    assert (size, names) == (160, ["embed", "head"])  # the tied 10x4 weight (in both) beats body.2's 4x6 + 6
    size, names = get_max_layer_size(list(model.named_children()), sizes, ["Sequential"])
    assert (size, names) == (sizes["body"], ["body"]) and sizes["body"] > sizes["embed"]


class MyParam(nn.Parameter):
    pass


def test_set_module_tensor_to_device_moves_in_place_keeping_the_parameter_class():
    model = nn.Sequential(nn.Linear(3, 2))
    model[0].weight = MyParam(torch.zeros(2, 3))
    set_module_tensor_to_device(model, "0.weight", "meta")
    assert model[0].weight.is_meta and type(model[0].weight) is MyParam
    with pytest.raises(ValueError, match="is on the meta device, we need a `value`"):
        set_module_tensor_to_device(model, "0.weight", "cpu")
    value = torch.arange(6, dtype=torch.float64).reshape(2, 3)
    set_module_tensor_to_device(model, "0.weight", "cpu", value=value)
    weight = model[0].weight
    assert type(weight) is MyParam and weight.dtype == torch.float32 and weight.requires_grad  # the old dtype
    assert torch.equal(weight, value.float())
    set_module_tensor_to_device(model, "0.bias", "cpu", value=torch.ones(2), dtype=torch.float16)
    assert model[0].bias.dtype == torch.float16
    with pytest.raises(ValueError, match="Trying to set a tensor of shape"):
        set_module_tensor_to_device(model, "0.weight", "cpu", value=torch.zeros(3, 2))
    with pytest.raises(ValueError, match="does not have a parameter or a buffer named nope"):
        set_module_tensor_to_device(model, "0.nope", "cpu")
    norm = nn.BatchNorm1d(2)
    set_module_tensor_to_device(norm, "running_mean", "cpu", value=torch.full((2,), 3.0))
    assert "running_mean" in norm._buffers and torch.equal(norm.running_mean, torch.full((2,), 3.0))


def test_set_module_tensor_to_device_reuses_tied_weights_through_the_map():
    model = Tied()
    shared = torch.randn(10, 4)
    tied_map = {shared.data_ptr(): {}}
    set_module_tensor_to_device(model, "embed.weight", "cpu", value=shared, tied_params_map=tied_map)
    first = model.embed.weight
    assert tied_map[shared.data_ptr()]["cpu"] is first
    set_module_tensor_to_device(model, "head.weight", "cpu", value=shared, tied_params_map=tied_map)
    assert model.head.weight is first  # the tied weight was put on the device once


def test_load_state_dict_reads_safetensors_onto_the_device_map(tmp_path):
    tensors = {"a.weight": torch.randn(2, 2), "a.bias": torch.randn(2), "b.weight": torch.randn(3)}
    save_file(tensors, str(tmp_path / "m.safetensors"), metadata={"format": "pt"})
    loaded = load_state_dict(str(tmp_path / "m.safetensors"))
    assert sorted(loaded) == sorted(tensors) and all(torch.equal(loaded[k], tensors[k]) for k in tensors)
    mapped = load_state_dict(str(tmp_path / "m.safetensors"), device_map={"a": "cpu", "b": "disk"})
    assert all(t.device.type == "cpu" for t in mapped.values()) and torch.equal(mapped["b.weight"], tensors["b.weight"])
    save_file(tensors, str(tmp_path / "tf.safetensors"), metadata={"format": "tf"})
    with pytest.raises(ValueError, match="only the pt format"):
        load_state_dict(str(tmp_path / "tf.safetensors"))
    torch.save(tensors, tmp_path / "m.bin")
    assert torch.equal(load_state_dict(str(tmp_path / "m.bin"))["a.bias"], tensors["a.bias"])


class Evil:
    def __reduce__(self):
        return (os.system, ("echo pwned",))


def test_save_writes_on_the_main_process_only_and_load_is_weights_only(tmp_path, monkeypatch):
    import numpy as np

    state = {"w": torch.ones(2), "rng": np.arange(3, dtype=np.uint32), "step": 4}
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("LOCAL_RANK", "0")
    save(state, tmp_path / "r1.pt")
    assert not (tmp_path / "r1.pt").exists()  # not the main process
    save(state, tmp_path / "node.pt", save_on_each_node=True)
    assert (tmp_path / "node.pt").exists()  # the local main process of its machine
    monkeypatch.setenv("RANK", "0")
    save(state, tmp_path / "r0.pt")
    back = load(tmp_path / "r0.pt")
    assert torch.equal(back["w"], state["w"]) and back["step"] == 4 and list(back["rng"]) == [0, 1, 2]
    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(pickle.UnpicklingError):
        load(tmp_path / "evil.pt")


def test_save_with_safe_serialization_drops_shared_tensors(tmp_path):
    model = Tied()
    save(model.state_dict(), tmp_path / "m.safetensors", safe_serialization=True)
    saved = load_file(str(tmp_path / "m.safetensors"))
    assert "embed.weight" in saved and "head.weight" not in saved
    assert torch.equal(saved["embed.weight"], model.embed.weight.detach())

