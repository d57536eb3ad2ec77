"""dispatch_model(offload_index=...): weights another loader already put on disk (transformers' from_pretrained
hands over an Accelerate offload index: `<name>.dat` files with dtype and shape, or entries pointing into the
checkpoint's safetensors file), read where they lie; and get_max_memory converting the caller's sizes in place."""

from __future__ import annotations

import torch
from safetensors.torch import save_file
from torch import nn

from acc.big_model import dispatch_model, get_max_memory, init_empty_weights
from acc.utils.offload import offload_weight


def model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 3))


def empty_copy() -> nn.Module:
    with init_empty_weights():
        return model()


def test_weights_in_dat_files_of_an_offload_index_run_the_model(tmp_path):
    reference, x = model(), torch.randn(5, 4)
    index: dict = {}
    for name, tensor in reference.state_dict().items():
        offload_weight(tensor, name, tmp_path, index)
    meta = empty_copy()
    dispatch_model(meta, {"0": "cpu", "1": "cpu", "2": "disk"}, offload_dir=tmp_path, offload_index=index,
                   state_dict={k: v for k, v in reference.state_dict().items() if k.startswith("0.")})
    assert meta[2].weight.is_meta  # still on disk: read for each forward
    assert torch.equal(meta(x), reference(x))


def test_entries_pointing_into_a_safetensors_file_are_read_from_it_with_the_asked_dtype(tmp_path):
    reference, x = model(), torch.randn(5, 4)
    file = tmp_path / "model.safetensors"
    save_file({k: v.to(torch.float64) for k, v in reference.state_dict().items()}, str(file))
    index = {name: {"safetensors_file": str(file), "weight_name": name, "dtype": "float32"}
             for name in reference.state_dict()}
    meta = empty_copy()
    dispatch_model(meta, {"": "disk"}, offload_dir=tmp_path / "unused", offload_index=index)
    out = meta(x)
    assert out.dtype == torch.float32 and torch.equal(out, reference(x))
    assert not (tmp_path / "unused").exists()  # nothing was written: the weights were read where they lie


def test_get_max_memory_converts_the_given_sizes_in_place_as_accelerate_does():
    budgets = {"cpu": "2MB", "disk": 10}
    out = get_max_memory(budgets)
    assert budgets == {"cpu": 2 * 10**6, "disk": 10} and out == {"cpu": 2 * 10**6, "disk": 10}


def test_load_offloaded_weights_fills_a_meta_model_from_an_offload_folder(tmp_path):
    from acc.utils import load_offloaded_weights, offload_state_dict
    from acc.utils.modeling import load_offloaded_weights as same

    reference, x = model(), torch.randn(5, 4)
    offload_state_dict(tmp_path, reference.state_dict())
    import json

    meta = empty_copy()
    load_offloaded_weights(meta, json.loads((tmp_path / "index.json").read_text()), tmp_path)
    assert same is load_offloaded_weights and not meta[0].weight.is_meta
    assert torch.equal(meta(x), reference(x))


def test_get_module_class_from_name_finds_a_submodules_class():
    from acc.utils import get_module_class_from_name
    from acc.utils.dataclasses import get_module_class_from_name as same

    net = nn.Sequential(nn.Linear(2, 2), nn.Sequential(nn.ReLU(), nn.LayerNorm(2)))
    assert same is get_module_class_from_name
    assert get_module_class_from_name(net, "LayerNorm") is nn.LayerNorm
    assert get_module_class_from_name(net, "Sequential") is nn.Sequential
    assert get_module_class_from_name(net, "Conv2d") is None
