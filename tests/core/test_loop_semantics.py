"""Mixed precision, accumulation, clipping and schedulers on one process (multi-process: tests/plugins/ddp)."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, AutocastKwargs, GradScalerKwargs, set_seed


def data(n: int = 256) -> TensorDataset:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(n, 8, generator=g)
    w = torch.randn(8, 1, generator=g)
    return TensorDataset(x, x @ w + 0.01 * torch.randn(n, 1, generator=g))


@pytest.fixture(autouse=True)
def fp16_on_cpu(monkeypatch):
    """fp16 on the CPU is float32 by default (as in Accelerate); these tests exercise the real fp16 path."""
    monkeypatch.setenv("ACC_FP16_ON_CPU", "1")


def make(fresh_pm, **kwargs):
    set_seed(0)
    acc = Accelerator(plugin_manager=fresh_pm, **kwargs)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    return acc, model, opt


def train(fresh_pm, epochs: int = 8, **kwargs) -> float:
    acc, model, opt = make(fresh_pm, **kwargs)
    loader = DataLoader(data(), batch_size=16, shuffle=True)
    model, opt, loader = acc.prepare(model, opt, loader)
    for _ in range(epochs):
        for x, y in loader:
            with acc.accumulate(model):
                loss = nn.functional.mse_loss(model(x), y)
                acc.backward(loss)
                opt.step()
                opt.zero_grad()
    with torch.no_grad():
        x, y = data().tensors
        return nn.functional.mse_loss(acc.unwrap_model(model)(x), y).item()


@pytest.mark.parametrize("mode", ["bf16", "fp16"])
def test_mixed_precision_trains_close_to_fp32(fresh_pm, mode):
    fp32 = train(fresh_pm, mixed_precision="no")
    mixed = train(fresh_pm, mixed_precision=mode)
    start = train(fresh_pm, epochs=0)
    assert fp32 < 0.05 * start  # the model really learns
    # stated tolerance: the low-precision run ends within 0.02 absolute loss of the fp32 run
    assert abs(mixed - fp32) < 0.02, (mode, mixed, fp32, start)


def test_outputs_are_float32_unless_opted_out(fresh_pm):
    acc, model, _ = make(fresh_pm, mixed_precision="bf16")
    model = acc.prepare(model)
    inner_dtypes = []
    model[0].register_forward_hook(lambda m, i, o: inner_dtypes.append(o.dtype))
    assert model(torch.randn(2, 8)).dtype == torch.float32 and inner_dtypes == [torch.bfloat16]
    plain = acc.unwrap_model(model, keep_fp32_wrapper=False)
    assert plain(torch.randn(2, 8)).dtype == torch.float32 and inner_dtypes[-1] == torch.float32
    acc2, model2, _ = make(fresh_pm, mixed_precision="bf16", kwargs_handlers=[AutocastKwargs(outputs_float32=False)])
    assert acc2.prepare(model2)(torch.randn(2, 8)).dtype == torch.bfloat16


def test_autocast_context_for_code_outside_the_model(fresh_pm):
    acc, _, _ = make(fresh_pm, mixed_precision="bf16")
    a = torch.randn(4, 4)
    with acc.autocast():
        assert (a @ a).dtype == torch.bfloat16
    acc_no, _, _ = make(fresh_pm)
    with acc_no.autocast():
        assert (a @ a).dtype == torch.float32


def test_fp16_overflow_skips_the_step_reports_it_and_training_continues(fresh_pm):
    acc, model, opt = make(fresh_pm, mixed_precision="fp16")
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.5)
    model, opt, sched = acc.prepare(model, opt, sched)
    x, y = data(16).tensors

    def step(poison: bool) -> None:
        loss = nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        if poison:
            model[0].weight.grad[0, 0] = float("inf")
        opt.step()
        sched.step()
        opt.zero_grad()

    for _ in range(20):  # the initial scale (2**16) may overflow fp16 at first: the scaler backs off
        step(False)
        if not acc.optimizer_step_was_skipped:
            break
    assert not acc.optimizer_step_was_skipped and acc.applied_steps == 1
    before = [p.detach().clone() for p in model.parameters()]
    scale, lr = acc.scaler.get_scale(), sched.get_last_lr()
    step(True)
    assert acc.optimizer_step_was_skipped and acc.applied_steps == 1
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert acc.scaler.get_scale() == scale / 2 and sched.get_last_lr() == lr  # scheduler did not advance
    step(False)
    assert not acc.optimizer_step_was_skipped and acc.applied_steps == 2
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))


def test_fp16_clipping_sees_unscaled_gradients(fresh_pm):
    norms = {}
    for mode in ("no", "fp16"):  # a moderate initial scale so the first backward does not overflow
        acc, model, opt = make(fresh_pm, mixed_precision=mode, kwargs_handlers=[GradScalerKwargs(init_scale=256)])
        model, opt = acc.prepare(model, opt)
        x, y = data(16).tensors
        acc.backward(nn.functional.mse_loss(model(x), y))
        norms[mode] = acc.clip_grad_norm_(model.parameters(), max_norm=1e9).item()
    assert norms["fp16"] == pytest.approx(norms["no"], rel=2e-2)


def test_accumulation_equals_one_big_batch(fresh_pm):
    def run(batch: int, k: int) -> torch.Tensor:
        set_seed(0)
        acc = Accelerator(plugin_manager=fresh_pm, gradient_accumulation_steps=k)
        model = nn.Linear(8, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        loader = DataLoader(data(64), batch_size=batch)
        model, opt, loader = acc.prepare(model, opt, loader)
        for x, y in loader:
            with acc.accumulate(model):
                acc.backward(nn.functional.mse_loss(model(x), y))
                opt.step()
                opt.zero_grad()
        return torch.cat([p.detach().flatten() for p in model.parameters()])

    assert torch.allclose(run(8, 4), run(32, 1), rtol=1e-5, atol=1e-6)


def _accumulate_over(fresh_pm, **kwargs):
    acc = Accelerator(plugin_manager=fresh_pm, gradient_accumulation_steps=4, **kwargs)
    model = nn.Linear(8, 1)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 1.0 / (1 + step))
    loader = DataLoader(data(80), batch_size=8)  # 10 micro-batches: syncs at 4, 8 and 10 (end of data)
    model, opt, sched, loader = acc.prepare(model, opt, sched, loader)
    syncs, lrs, steps = [], [], []
    for x, y in loader:
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            syncs.append(acc.sync_gradients)
            steps.append(acc.step)
            opt.step()
            sched.step()
            opt.zero_grad()
            lrs.append(sched.get_last_lr()[0])
    assert syncs == [False, False, False, True, False, False, False, True, False, True]
    assert acc.applied_steps == 3 and len(set(lrs)) == 4  # initial lr, then one change per optimizer step
    # Accelerate's accelerator.step counts micro-steps and starts again at the end of the data
    assert steps == [1, 2, 3, 4, 5, 6, 7, 8, 9, 0] and acc.step == 0
    return sched


def test_end_of_data_forces_a_sync_and_the_scheduler_steps_with_applied_steps(fresh_pm):
    sched = _accumulate_over(fresh_pm)
    # micro-steps count towards the scheduler's step count (Accelerate's adjust_scheduler), not its LR
    assert sched.get_last_lr()[0] == pytest.approx(1 / 4) and sched.scheduler._step_count == 1 + 10
    acc_sched = _accumulate_over(fresh_pm, semantics="acc")
    assert acc_sched.get_last_lr()[0] == pytest.approx(1 / 4) and acc_sched.scheduler._step_count == 1 + 10


def test_clipping_on_micro_steps_clips_as_accelerate_does_or_not_at_all(fresh_pm):
    for semantics, on_micro in (("accelerate", True), ("acc", False)):
        acc = Accelerator(plugin_manager=fresh_pm, gradient_accumulation_steps=2, semantics=semantics)
        model = acc.prepare(nn.Linear(8, 1))
        x, y = data(8).tensors
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            norm = acc.clip_grad_norm_(model.parameters(), 1.0)
            assert not acc.sync_gradients and (norm is not None and norm > 0) == on_micro, semantics
        with acc.accumulate(model):
            acc.backward(nn.functional.mse_loss(model(x), y))
            assert acc.sync_gradients and acc.clip_grad_norm_(model.parameters(), 1.0) > 0


def test_fp16_on_the_cpu_trains_float32_unless_asked(fresh_pm, monkeypatch, capsys):
    monkeypatch.setenv("ACC_FP16_ON_CPU", "0")
    acc, model, _ = make(fresh_pm, mixed_precision="fp16")
    model = acc.prepare(model)
    assert acc.mixed_precision == "fp16" and acc.scaler is None and not acc.native_amp
    assert model(torch.randn(2, 8)).dtype == torch.float32
    monkeypatch.setenv("ACC_FP16_ON_CPU", "1")
    acc2, _, _ = make(fresh_pm, mixed_precision="fp16")
    assert acc2.scaler is not None and acc2.native_amp


def test_native_amp_false_turns_autocast_off(fresh_pm):
    acc, model, _ = make(fresh_pm, mixed_precision="bf16")
    assert acc.native_amp
    acc.native_amp = False  # what diffusers' scripts do on devices where autocast is slow
    model = acc.prepare(model)
    inner = []
    model[0].register_forward_hook(lambda m, i, o: inner.append(o.dtype))
    model(torch.randn(2, 8))
    assert inner == [torch.float32]


def test_unsupported_precision_is_a_clear_error_at_setup(fresh_pm, monkeypatch):
    import acc.runtime.precision

    monkeypatch.setattr(acc.runtime.precision.torch.amp, "is_autocast_available", lambda kind: False)
    with pytest.raises(acc.AccError, match="mixed_precision 'fp16' needs autocast on device 'cpu'"):
        Accelerator(plugin_manager=fresh_pm, mixed_precision="fp16")
