"""DummyOptim/DummyScheduler: the optimizer and scheduler of a DeepSpeed config, with real processes on CPU
(DeepSpeed's CPU accelerator, gloo), and the rules around them (in process)."""

from __future__ import annotations

import json
import math

import pytest
import torch

from acc import AccError
from acc.contract.settings import ResolvedSettings
from acc.runtime.placeholders import check_prepare, scheduler_for
from acc.utils import DummyOptim, DummyScheduler
from acc_deepspeed.config import describe, fill_optimizer_and_scheduler, read_user_config
from tests.conftest import ACC, WORKERS, read_rank_results, run
from tests.plugins.ddp.test_ddp import acc_launch

DS = ["--backend", "deepspeed", "--nproc", "2"]
CONFIG = {
    "train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto", "gradient_accumulation_steps": "auto",
    "zero_optimization": {"stage": 2},
    # torch_adam: DeepSpeed builds torch.optim.AdamW (its CPU FusedAdam would need a compiled op)
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "betas": [0.9, 0.999],
                                              "eps": 1e-8, "torch_adam": True}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto",
                                                      "warmup_num_steps": "auto", "total_num_steps": "auto",
                                                      "warmup_type": "linear"}},
}
LR, WEIGHT_DECAY, WARMUP, TOTAL, STEPS = 0.05, 0.01, 4, 24, 12  # the worker's defaults


def expected_lr(step: int, processes: int = 2) -> float:
    """WarmupDecayLR's LR at optimizer step `step` (0-based), its "auto" values filled as Accelerate fills them:
    warmup_min_lr 0, warmup_max_lr DummyOptim's lr, total_num_steps DummyScheduler's / processes."""
    total, i = math.ceil(TOTAL / processes), step - 1
    if i < 0:
        return 0.0
    return LR * (i / WARMUP if i < WARMUP else max(0.0, (total - i) / (total - WARMUP)))


# ------------------------------------------------------------------------------ two processes, a config file


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dummy")
    (tmp / "ds.json").write_text(json.dumps(CONFIG))
    acc_launch(tmp, [*DS, "--deepspeed-config", "ds.json"], "dummy_optim.py", ["--out", str(tmp / "dummy"),
                                                                               "--via", "hooks"])
    # the same run with a real AdamW and a LambdaLR of the same schedule, stepped once per optimizer step
    acc_launch(tmp, [*DS, "--zero-stage", "2", "--scheduler-stepping", "once"], "dummy_optim.py",
               ["--out", str(tmp / "real"), "--mode", "real"])
    return tmp, read_rank_results(tmp / "dummy"), read_rank_results(tmp / "real")


@pytest.mark.slow
def test_the_engine_trains_with_the_configs_optimizer_filled_from_dummy_optim(runs):
    _, dummy, _ = runs
    res = dummy[0]
    assert res["world"] == 2 and len(res["losses"]) == STEPS
    assert res["optimizer"] == "AdamW" and res["weight_decay"] == WEIGHT_DECAY and res["betas"] == [0.9, 0.999]
    first, last = res["losses"][:3], res["losses"][-3:]  # the first two steps have LR 0 (warmup from 0)
    assert sum(last) / 3 < 0.5 * sum(first) / 3, res["losses"]
    assert dummy[0]["losses"] == dummy[1]["losses"] and dummy[0]["weights"] == dummy[1]["weights"]


@pytest.mark.slow
def test_accelerator_state_shows_the_users_config_then_the_engines(runs):
    """AcceleratorState().deepspeed_plugin.deepspeed_config: the file's "auto" values before prepare, the values
    the engine runs with after (as Accelerate shows them)."""
    _, dummy, _ = runs
    before, after = dummy[0]["config_before"], dummy[0]["config_after"]
    assert before["train_micro_batch_size_per_gpu"] == "auto" and before["zero_optimization"]["stage"] == 2
    assert after["train_micro_batch_size_per_gpu"] == 8 and after["train_batch_size"] == 16
    assert after["optimizer"]["params"]["lr"] == LR and dummy[0]["zero_stage"] == 2


@pytest.mark.slow
def test_the_lr_follows_the_configs_schedule_step_by_step(runs):
    _, dummy, _ = runs
    for rank in (0, 1):
        lrs, last = dummy[rank]["lrs"], dummy[rank]["last_lrs"]
        assert lrs == pytest.approx([expected_lr(k) for k in range(STEPS)], abs=1e-12)
        # the prepared scheduler reports the engine scheduler's LR after each step (the next step's)
        assert last == pytest.approx([expected_lr(k + 1) for k in range(STEPS)], abs=1e-12)
    assert max(dummy[0]["lrs"]) == pytest.approx(LR)  # warmup_max_lr came from DummyOptim(lr=...)


@pytest.mark.slow
def test_it_matches_the_same_run_with_a_real_adamw_and_lambdalr(runs):
    # tolerance: both runs apply torch.optim.AdamW inside the same ZeRO-2 optimizer, so they agree to float32
    # rounding; 1e-6 relative (observed: bit-identical)
    _, dummy, real = runs
    assert real[0]["optimizer"] == "AdamW"
    assert real[0]["lrs"] == pytest.approx(dummy[0]["lrs"], abs=1e-12)
    assert real[0]["losses"] == pytest.approx(dummy[0]["losses"], rel=1e-6)
    assert torch.allclose(torch.tensor(dummy[0]["weights"]), torch.tensor(real[0]["weights"]), rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_a_config_given_in_code_through_deepspeed_plugin_trains_the_same(runs):
    tmp, dummy, _ = runs
    acc_launch(tmp, DS, "dummy_optim.py", ["--out", str(tmp / "code"), "--via", "hooks", "--config-in-code",
                                           str(tmp / "ds.json")])
    code = read_rank_results(tmp / "code")
    assert code[0]["losses"] == dummy[0]["losses"] and code[0]["lrs"] == dummy[0]["lrs"]


@pytest.mark.slow
def test_resuming_restores_the_engines_scheduler(runs):
    tmp, dummy, _ = runs
    flags = [*DS, "--deepspeed-config", "ds.json"]
    half = STEPS // 2
    acc_launch(tmp, flags, "dummy_optim.py", ["--out", str(tmp / "a"), "--via", "hooks", "--steps", str(half),
                                              "--save", str(tmp / "ckpt")])
    acc_launch(tmp, flags, "dummy_optim.py", ["--out", str(tmp / "b"), "--via", "hooks", "--steps", str(half),
                                              "--load", str(tmp / "ckpt"), "--start", str(half)])
    b = read_rank_results(tmp / "b")[0]
    assert b["lrs"] == dummy[0]["lrs"][half:] and b["last_lrs"] == dummy[0]["last_lrs"][half:]
    assert b["losses"] == pytest.approx(dummy[0]["losses"][half:], rel=1e-6)


@pytest.mark.slow
def test_a_dummy_optim_without_an_optimizer_section_fails_saying_so(tmp_path):
    config = {k: v for k, v in CONFIG.items() if k != "optimizer"}
    (tmp_path / "ds.json").write_text(json.dumps(config))
    proc = run([ACC, "launch", *DS, "--deepspeed-config", "ds.json", str(WORKERS / "dummy_optim.py"), "--out", "o",
                "--via", "hooks"], tmp_path)
    assert proc.returncode == 1
    assert "DummyOptim stands for the optimizer a DeepSpeed config defines, but ds.json has no \"optimizer\" " \
           "section: add one" in proc.stderr


@pytest.mark.slow
def test_the_script_as_written_through_accelerator_prepare(runs):
    tmp, dummy, _ = runs
    acc_launch(tmp, [*DS, "--deepspeed-config", "ds.json"], "dummy_optim.py", ["--out", str(tmp / "prepare")])
    res = read_rank_results(tmp / "prepare")
    assert res[0]["losses"] == dummy[0]["losses"] and res[0]["lrs"] == dummy[0]["lrs"]


# ------------------------------------------------------------------------------ in process: the rules


def settings(**values) -> ResolvedSettings:
    base = {"gradient_accumulation_steps": 1, "mixed_precision": "no", "zero_stage": None, "offload_optimizer": "none",
            "offload_params": "none", "gradient_clipping": None, "deepspeed_config": None, "zero_buckets": "deepspeed",
            "zero_collectives": "auto"}
    base.update(values)
    return ResolvedSettings(base, {})


def model() -> torch.nn.Module:
    return torch.nn.Linear(3, 1)


def test_auto_values_are_filled_as_accelerate_fills_them():
    config = json.loads(json.dumps(CONFIG))
    config["optimizer"]["params"]["eps"] = "auto"
    optimizer = DummyOptim(model().parameters(), lr=0.1, weight_decay=0.2, eps=1e-6)
    scheduler = DummyScheduler(optimizer, total_num_steps=9, warmup_num_steps=3)
    assert scheduler_for(optimizer) is scheduler
    assert fill_optimizer_and_scheduler(config, optimizer, scheduler, 2, False, "ds.json") == []
    assert config["optimizer"]["params"] == {"lr": 0.1, "weight_decay": 0.2, "betas": [0.9, 0.999], "eps": 1e-6,
                                             "torch_adam": True}
    assert config["scheduler"]["params"] == {"warmup_min_lr": 0, "warmup_max_lr": 0.1, "warmup_num_steps": 3,
                                             "total_num_steps": 5, "warmup_type": "linear"}  # ceil(9 / 2)
    config = json.loads(json.dumps(CONFIG))
    fill_optimizer_and_scheduler(config, optimizer, scheduler, 2, True, "ds.json")
    assert config["scheduler"]["params"]["total_num_steps"] == 9  # split batches: not divided


def test_values_the_config_sets_are_kept():
    config = json.loads(json.dumps(CONFIG))
    config["optimizer"]["params"]["lr"] = 3e-4
    config["scheduler"]["params"]["warmup_num_steps"] = 10
    optimizer = DummyOptim(model().parameters(), lr=0.1)
    assert fill_optimizer_and_scheduler(config, optimizer, DummyScheduler(optimizer, total_num_steps=8), 1, False,
                                        "ds.json") == []
    assert config["optimizer"]["params"]["lr"] == 3e-4 and config["scheduler"]["params"]["warmup_num_steps"] == 10
    assert config["scheduler"]["params"]["warmup_max_lr"] == 0.1  # Accelerate: the DummyOptim's lr


def test_a_real_optimizer_with_a_dummy_scheduler_uses_the_configs_scheduler():
    config = {k: v for k, v in json.loads(json.dumps(CONFIG)).items() if k != "optimizer"}
    optimizer = torch.optim.SGD(model().parameters(), lr=0.3)
    scheduler = DummyScheduler(optimizer, total_num_steps=4, warmup_num_steps=2)
    assert scheduler_for(optimizer) is scheduler
    assert fill_optimizer_and_scheduler(config, optimizer, scheduler, 1, False, "ds.json") == []
    assert config["scheduler"]["params"]["warmup_max_lr"] == 0.3 and config["scheduler"]["params"]["total_num_steps"] == 4


@pytest.mark.parametrize("case,fragment", [
    ("dummy optimizer, no section", "DummyOptim stands for the optimizer a DeepSpeed config defines, but ds.json has "
     "no \"optimizer\" section: add one"),
    ("real optimizer and a section", "ds.json defines an optimizer (AdamW) and the script passes its own (SGD): remove "
     "the config's \"optimizer\" section, or pass acc.utils.DummyOptim(model.parameters(), lr=...)"),
    ("dummy scheduler, no section", "DummyScheduler stands for the scheduler a DeepSpeed config defines, but ds.json "
     "has no \"scheduler\" section"),
    ("torch scheduler and a section", "ds.json defines a scheduler (WarmupDecayLR) and the script built a torch LR "
     "scheduler on its optimizer"),
    ("auto nothing gives", "ds.json sets optimizer.params.eps = \"auto\", but nothing gives it: write a value in the "
     "config, or pass eps=... to DummyOptim"),
    ("scheduler auto, no dummy scheduler", "ds.json sets scheduler.params.warmup_num_steps = \"auto\", but nothing "
     "gives it: write a value in the config, or pass warmup_num_steps=... to a DummyScheduler(optimizer, ...) made "
     "before prepare"),
])
def test_what_is_missing_is_said(case, fragment):
    config = json.loads(json.dumps(CONFIG))
    params = model().parameters()
    optimizer, scheduler = DummyOptim(params), None
    if case == "dummy optimizer, no section":
        del config["optimizer"]
    elif case == "real optimizer and a section":
        optimizer = torch.optim.SGD(params, lr=0.1)
    elif case == "dummy scheduler, no section":
        del config["scheduler"]
        scheduler = DummyScheduler(optimizer)
    elif case == "torch scheduler and a section":
        del config["optimizer"]
        optimizer = torch.optim.SGD(params, lr=0.1)
        torch.optim.lr_scheduler.StepLR(optimizer, 1)
    elif case == "auto nothing gives":
        config["optimizer"]["params"]["eps"] = "auto"
        scheduler = DummyScheduler(optimizer, total_num_steps=4, warmup_num_steps=2)
    problems = fill_optimizer_and_scheduler(config, optimizer, scheduler, 1, False, "ds.json")
    assert any(fragment in p for p in problems), problems


def test_the_backends_wrap_hook_raises_the_problems_before_building_an_engine():
    from acc.contract.context import RunContext
    from acc_deepspeed import plugin

    ctx = RunContext(settings=settings(), backend="deepspeed")
    ctx.backend_state["user_config"] = {"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}
    net = model()
    with pytest.raises(AccError, match="DummyOptim stands for the optimizer a DeepSpeed config defines, but the "
                                       "DeepSpeed settings has no \"optimizer\" section"):
        plugin.acc_wrap(ctx=ctx, models=[net], optimizers=[DummyOptim(net.parameters())])
    assert "engine" not in ctx.backend_state
    with pytest.raises(AccError, match="prepare the model and its DummyOptim in the same call"):
        plugin.acc_wrap(ctx=ctx, models=[], optimizers=[DummyOptim(net.parameters())])


def test_a_dummy_scheduler_before_the_engine_exists_says_to_prepare_it():
    optimizer = DummyOptim(model().parameters())
    scheduler = DummyScheduler(optimizer, total_num_steps=4)
    for call in (scheduler.step, scheduler.get_last_lr, scheduler.state_dict, optimizer.step):
        with pytest.raises(AccError, match="pass it to accelerator.prepare together with the model on the deepspeed "
                                           "backend"):
            call()

    class EngineScheduler:
        last_batch_iteration = 3

        def get_last_lr(self):
            return [0.5]

        def state_dict(self):
            return {"last_batch_iteration": self.last_batch_iteration}

        def load_state_dict(self, state):
            self.last_batch_iteration = state["last_batch_iteration"]

    scheduler._bind(EngineScheduler())
    scheduler.step()  # the engine steps it: nothing here
    assert scheduler.get_last_lr() == [0.5] and scheduler.state_dict() == {"last_batch_iteration": 3}
    scheduler.load_state_dict({"last_batch_iteration": 7})
    assert scheduler.last_batch_iteration == 7  # other attributes are the engine scheduler's


def test_preparing_a_placeholder_outside_deepspeed_names_the_backend():
    net = model()
    for placeholder in (DummyOptim(net.parameters()), DummyScheduler(torch.optim.SGD(net.parameters(), lr=0.1))):
        with pytest.raises(AccError) as info:
            check_prepare([net, placeholder], "ddp", "MULTI_CPU")
        text = str(info.value)
        assert f"prepare() got {type(placeholder).__name__}" in text and "this run uses the ddp backend" in text
        assert "use a real optimizer (e.g. torch.optim.AdamW(model.parameters(), lr=...))" in text
    check_prepare([net, DummyOptim(net.parameters())], "deepspeed", "DEEPSPEED")  # fine there
    check_prepare([net, torch.optim.SGD(net.parameters(), lr=0.1)], "ddp", "MULTI_CPU")  # nothing to refuse


def test_accelerator_prepare_refuses_a_dummy_optim_on_the_cpu_backend(fresh_pm):
    from acc import Accelerator

    accelerator = Accelerator(plugin_manager=fresh_pm, cpu=True)
    net = model()
    with pytest.raises(AccError, match="this run uses the cpu backend, which builds no optimizer: use a real "
                                       "optimizer"):
        accelerator.prepare(net, DummyOptim(net.parameters()))


def test_the_deepspeed_config_setting_takes_the_json_itself():
    text = json.dumps({"zero_optimization": {"stage": 1}})
    assert read_user_config(text) == {"zero_optimization": {"stage": 1}}
    assert read_user_config("  " + text) == {"zero_optimization": {"stage": 1}}
    assert describe(text) == "the DeepSpeed config given in code" and describe("ds.json") == "ds.json"
    assert describe(None) == "the DeepSpeed settings"
    with pytest.raises(AccError, match=r"deepspeed_config \(the DeepSpeed config given in code\): not valid JSON"):
        read_user_config("{nope")
