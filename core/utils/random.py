"""Accelerate's `accelerate.utils.random`: seeding every generator (`set_seed`, acc.runtime.seeding) and bringing
every process's random state to the main process's (`synchronize_rng_state(s)`). acc's own objects."""

from acc.runtime.seeding import set_seed
from acc.utils.operations import synchronize_rng_state, synchronize_rng_states

__all__ = ["set_seed", "synchronize_rng_state", "synchronize_rng_states"]
