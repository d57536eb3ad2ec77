"""Accelerate's `_reset_state` test helpers: the next Accelerator sets its run up anew (another precision, another
accumulation), and GradientState returns to a fresh loop."""

from __future__ import annotations

import pytest

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


def test_a_state_read_after_reset_says_the_run_was_forgotten(fresh_pm):
    accelerator = Accelerator(plugin_manager=fresh_pm)
    state = PartialState()
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'someotherthing'"):
        accelerator.state.someotherthing
    accelerator.state.someotherthing = "mine"
    assert AcceleratorState().someotherthing == "mine"  # shared by every instance, as Accelerate's state is
    AcceleratorState._reset_state(reset_partial_state=True)
    with pytest.raises(AttributeError, match=r"`AcceleratorState` object has no attribute `num_processes`\. This "
                                             r"happens if `AcceleratorState\._reset_state\(\)` was called"):
        accelerator.num_processes
    with pytest.raises(AttributeError, match=r"`PartialState` object has no attribute `process_index`"):
        state.process_index
    assert not is_initialized()  # reading the forgotten state set nothing up
    with pytest.raises(AttributeError, match="'AcceleratorState' object has no attribute 'someotherthing'"):
        accelerator.state.someotherthing  # the reset cleared what was set
    again = Accelerator(plugin_manager=fresh_pm)
    assert state.num_processes == again.num_processes == 1  # a state made before sees the new run
