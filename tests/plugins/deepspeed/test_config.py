"""The DeepSpeed config completion, unit by unit (no processes, no deepspeed import)."""

from __future__ import annotations

import json

import pytest

from acc.contract.settings import ResolvedSettings
from acc_deepspeed.config import complete, read_user_config


def settings(**values) -> ResolvedSettings:
    base = {"gradient_accumulation_steps": 1, "mixed_precision": "no", "zero_stage": None, "offload_optimizer": "none",
            "offload_params": "none", "gradient_clipping": None}
    sources = {k: "flag --x" for k in values}
    base.update(values)
    return ResolvedSettings(base, sources)


def test_auto_values_come_from_acc():
    user = {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
            "bf16": {"enabled": "auto"}, "zero_optimization": {"stage": 3}}
    config, problems = complete(user, settings(gradient_accumulation_steps=2, mixed_precision="bf16"), 4, 8)
    assert problems == []
    assert config["train_micro_batch_size_per_gpu"] == 8 and config["gradient_accumulation_steps"] == 2
    assert config["train_batch_size"] == 8 * 2 * 4 and config["bf16"]["enabled"] is True
    assert config["zero_optimization"]["stage"] == 3
    assert config["gradient_clipping"] == 0.0  # DeepSpeed's own default (1.0) would clip silently


def test_contradicting_accumulation_names_both():
    _, problems = complete({"gradient_accumulation_steps": 4}, settings(gradient_accumulation_steps=2), 2, 4,
                           where="ds.json")
    assert problems == ["ds.json sets gradient_accumulation_steps = 4, but acc's is 2 (gradient_accumulation_steps "
                        "from flag --x); make them agree (or write \"auto\" in the DeepSpeed config to take acc's)"]


@pytest.mark.parametrize("user,acc_settings,fragment", [
    ({"train_micro_batch_size_per_gpu": 16}, {}, "train_micro_batch_size_per_gpu = 16, but acc's is 4"),
    ({"fp16": {"enabled": True}}, {}, "fp16.enabled = True, but acc's mixed_precision is 'no'"),
    ({"zero_optimization": {"stage": 1}}, {"zero_stage": 3}, "zero_optimization.stage = 1, but acc's is 3"),
    ({"zero_optimization": {"stage": 7}}, {}, "ZeRO stage 7 is not one of 0, 1, 2, 3"),
    ({"gradient_clipping": 0.5}, {"gradient_clipping": 1.0}, "gradient_clipping = 0.5, but acc's is 1.0"),
    ({}, {"offload_params": "cpu", "zero_stage": 2}, "offloading parameters needs ZeRO stage 3"),
])
def test_contradictions_are_problems(user, acc_settings, fragment):
    _, problems = complete(user, settings(**acc_settings), 2, 4)
    assert any(fragment in p for p in problems), problems


def test_flags_fill_the_config():
    config, problems = complete({}, settings(zero_stage=2, offload_optimizer="cpu", gradient_clipping=1.0), 2, 4)
    assert problems == []
    assert config["zero_optimization"] == {"stage": 2, "offload_optimizer": {"device": "cpu"}}
    assert config["gradient_clipping"] == 1.0 and config["train_batch_size"] == 8


def test_user_file_errors(tmp_path):
    with pytest.raises(Exception, match="does not exist"):
        read_user_config(str(tmp_path / "none.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{nope")
    with pytest.raises(Exception, match="not valid JSON"):
        read_user_config(str(bad))
    good = tmp_path / "ds.json"
    good.write_text(json.dumps({"zero_optimization": {"stage": 1}}))
    assert read_user_config(str(good)) == {"zero_optimization": {"stage": 1}}


def test_hidden_size_is_the_configs_else_the_largest_matrixs_larger_side():
    from acc_deepspeed.config import hidden_size

    assert hidden_size(768, [(10, 10)]) == 768
    assert hidden_size([256, 512, 1024], []) == 1024  # hidden_sizes: the largest, as Accelerate picks
    assert hidden_size(None, [(64,), (300, 100), (2500, 2500), (2500,)]) == 2500
    assert hidden_size(None, [(64,)]) is None


@pytest.mark.parametrize("stage,sizing,zero,want,cpu", [
    (3, "deepspeed", {}, {}, True),  # DeepSpeed's own defaults: nothing added
    (3, "deepspeed", {"reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto"},
     {"reduce_bucket_size": 10000, "stage3_prefetch_bucket_size": 9000}, True),  # "auto" as Accelerate fills it
    (3, "model", {}, {"reduce_bucket_size": 10000, "stage3_prefetch_bucket_size": 9000,
                      "stage3_param_persistence_threshold": 1000, "sub_group_size": 2500,
                      "stage3_max_live_parameters": 20000, "stage3_max_reuse_distance": 10000}, False),
    (3, "model", {}, {"reduce_bucket_size": 10000, "stage3_prefetch_bucket_size": 0,  # the CPU: no prefetching
                      "stage3_param_persistence_threshold": 1000, "sub_group_size": 2500,
                      "stage3_max_live_parameters": 20000, "stage3_max_reuse_distance": 10000}, True),
    (3, "model", {"stage3_prefetch_bucket_size": "auto"}, {"reduce_bucket_size": 10000,
     "stage3_prefetch_bucket_size": 9000, "stage3_param_persistence_threshold": 1000, "sub_group_size": 2500,
     "stage3_max_live_parameters": 20000, "stage3_max_reuse_distance": 10000}, True),  # "auto" is Accelerate's
    (3, "model", {"reduce_bucket_size": 123, "sub_group_size": 7},
     {"reduce_bucket_size": 123, "stage3_prefetch_bucket_size": 9000, "stage3_param_persistence_threshold": 1000,
      "sub_group_size": 7, "stage3_max_live_parameters": 20000,
      "stage3_max_reuse_distance": 10000}, False),  # the user's stand
    (2, "model", {}, {"reduce_bucket_size": 10000}, True),  # the stage-3 values mean nothing below stage 3
])
def test_bucket_sizes_come_from_the_hidden_size(stage, sizing, zero, want, cpu):
    from acc_deepspeed.config import BUCKET_KEYS, MODEL_KEYS, fill_buckets

    config = {"zero_optimization": {"stage": stage, **zero}}
    assert fill_buckets(config, 100, sizing, "ds.json", cpu=cpu) == []
    assert {k: v for k, v in config["zero_optimization"].items() if k in (*BUCKET_KEYS, *MODEL_KEYS)} == want


def test_zero_buckets_auto_is_model_with_a_hidden_size_and_deepspeeds_sizes_without():
    from acc_deepspeed.config import fill_buckets

    derived, model = {"zero_optimization": {"stage": 3}}, {"zero_optimization": {"stage": 3}}
    assert fill_buckets(derived, 100, "auto", "ds.json") == [] and fill_buckets(model, 100, "model", "ds.json") == []
    assert derived == model and derived["zero_optimization"]["reduce_bucket_size"] == 10000
    given = {"zero_optimization": {"stage": 3, "reduce_bucket_size": 123}}
    fill_buckets(given, 100, "auto", "ds.json")
    assert given["zero_optimization"]["reduce_bucket_size"] == 123  # the user's value wins
    unknown = {"zero_optimization": {"stage": 3}}
    assert fill_buckets(unknown, None, "auto", "ds.json") == [] and unknown == {"zero_optimization": {"stage": 3}}


def test_auto_buckets_without_a_hidden_size_are_a_problem_naming_the_keys():
    from acc_deepspeed.config import fill_buckets

    problems = fill_buckets({"zero_optimization": {"stage": 3, "reduce_bucket_size": "auto"}}, None, "deepspeed",
                            "ds.json")
    assert len(problems) == 1 and "ds.json: zero_optimization.reduce_bucket_size need the model's hidden size" in \
        problems[0] and "give the values as integers" in problems[0]
