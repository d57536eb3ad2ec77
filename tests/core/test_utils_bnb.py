"""acc.utils.bnb: Accelerate's bitsandbytes names (acc does not quantize yet: the quantizing functions say so)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from torch import nn

from acc.utils import has_4bit_bnb_layers, load_and_quantize_model
from acc.utils.bnb import get_keys_to_not_convert
from acc.utils.dataclasses import BnbQuantizationConfig


class CausalLM(nn.Module):
    base_model_prefix = "body"

    def __init__(self, tied: bool):
        super().__init__()
        self.body = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4))
        self.lm_head = nn.Linear(4, 10, bias=False)
        if tied:
            self.lm_head.weight = self.body[0].weight


class Base(nn.Module):
    base_model_prefix = "body"

    def __init__(self):
        super().__init__()
        self.embed, self.proj = nn.Embedding(10, 4), nn.Linear(4, 4)


def test_the_head_and_tied_modules_stay_in_full_precision_a_base_model_keeps_none():
    assert get_keys_to_not_convert(CausalLM(tied=False)) == ["lm_head"]
    assert sorted(set(get_keys_to_not_convert(CausalLM(tied=True)))) == ["body.0", "lm_head"]
    assert get_keys_to_not_convert(Base()) == []


def test_a_model_without_bitsandbytes_layers_has_none():
    assert has_4bit_bnb_layers(nn.Linear(2, 2)) is False


@pytest.mark.skipif(importlib.util.find_spec("bitsandbytes") is not None, reason="bitsandbytes is installed")
def test_quantizing_without_bitsandbytes_names_the_install_command():
    with pytest.raises(ImportError, match="pip install bitsandbytes"):
        load_and_quantize_model(nn.Linear(2, 2), BnbQuantizationConfig(load_in_8bit=True, torch_dtype=torch.float16))


def test_the_quantization_config_refuses_8_and_4_bit_at_once():
    with pytest.raises(ValueError):
        BnbQuantizationConfig(load_in_8bit=True, load_in_4bit=True)


@pytest.mark.parametrize("name,package", [("has_ao_layers", "torchao"),
                                          ("has_transformer_engine_layers", "transformer_engine")])
def test_fp8_layer_checks_name_the_library_they_need(name, package):
    import acc.utils

    if importlib.util.find_spec(package) is not None:
        pytest.skip(f"{package} is installed")
    with pytest.raises(ImportError, match=f"pip install {package}"):
        getattr(acc.utils, name)(nn.Linear(2, 2))


def test_fp8_mixed_precision_is_refused_saying_what_it_needs():
    from acc import Accelerator, AccError

    with pytest.raises(AccError, match="no fp8 mixed precision yet .*GPU with fp8 support"):
        Accelerator(mixed_precision="fp8")


def test_fp8_recipe_handlers_are_refused_and_handlers_show_under_accelerates_names():
    from acc import Accelerator, AccError
    from acc.utils import DistributedDataParallelKwargs, FP8BackendType, MSAMPRecipeKwargs

    with pytest.raises(AccError, match="MSAMPRecipeKwargs asks for fp8 training"):
        Accelerator(kwargs_handlers=[MSAMPRecipeKwargs()])
    ddp = DistributedDataParallelKwargs(find_unused_parameters=True)
    accelerator = Accelerator(kwargs_handlers=[ddp])
    assert accelerator.ddp_handler is ddp and accelerator.scaler_handler is None
    assert accelerator.fp8_backend is FP8BackendType.NO and not accelerator.has_fp8_handler
