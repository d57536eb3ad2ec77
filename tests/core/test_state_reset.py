"""Accelerate's `_reset_state` test helpers: the next Accelerator sets its run up anew (another precision, another
accumulation), and GradientState returns to a fresh loop."""

from __future__ import annotations

from acc import Accelerator
from acc.state import AcceleratorState, GradientState, PartialState, is_initialized


def test_reset_state_forgets_the_run_and_the_next_accelerator_starts_anew(fresh_pm):
    first = Accelerator(plugin_manager=fresh_pm, gradient_accumulation_steps=2)
    assert is_initialized() and AcceleratorState().mixed_precision == "no"
    AcceleratorState._reset_state(reset_partial_state=True)
    assert not is_initialized()
    second = Accelerator(plugin_manager=fresh_pm, mixed_precision="bf16")
    assert AcceleratorState().mixed_precision == "bf16" and second.gradient_accumulation_steps == 1
    assert first.gradient_accumulation_steps == 2  # the forgotten run's Accelerator keeps its own settings
    PartialState._reset_state()
    assert not is_initialized()


def test_gradient_state_reset_returns_to_a_fresh_loop(fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm, gradient_accumulation_steps=2)
    accelerator.sync_gradients = False
    accelerator.step = 3
    GradientState._reset_state()
    assert GradientState().sync_gradients and accelerator.step == 0 and GradientState().active_dataloader is None
