"""Accelerate's `accelerate.inference`: `prepare_pippy`, pipeline-parallel inference through torch's PiPPy.

acc has no pipeline-parallel inference yet: `prepare_pippy` raises an error that says so and what acc offers for a
model that does not fit one device (`load_checkpoint_and_dispatch(..., device_map="auto")`, which places its layers
across the devices and runs them in turn).
"""

from __future__ import annotations

from typing import Any, NoReturn

from acc.errors import AccError

PIPELINE_INFERENCE = False  # whether prepare_pippy runs (acc.test_utils.require_pippy skips its tests until it does)


def prepare_pippy(model: Any, split_points: Any = "auto", no_split_module_classes: Any = None,
                  example_args: Any = (), example_kwargs: Any = None, num_chunks: Any = None,
                  gather_output: bool = False) -> NoReturn:
    """Accelerate's pipeline-parallel wrapper (not in acc yet: an error saying so)."""
    raise AccError("prepare_pippy: acc has no pipeline-parallel (PiPPy) inference yet; for a model too large for one "
                   "device use acc.big_modeling.load_checkpoint_and_dispatch(model, checkpoint, device_map='auto'), "
                   "which spreads its layers over the devices, or run one copy per process with acc launch")


__all__ = ["prepare_pippy"]
