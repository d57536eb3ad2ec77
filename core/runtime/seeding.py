"""Seeding every random number generator a training run touches."""

from __future__ import annotations

import os
import random


def set_seed(seed: int, device_specific: bool = False, deterministic: bool = False) -> int:
    """Seed python's `random`, numpy (if installed) and torch (CPU and every accelerator), as Accelerate does.

    With `device_specific`, each process adds its rank so processes draw different numbers (e.g. for dropout
    masks); `deterministic` also makes torch use deterministic algorithms only. Returns the seed used.
    """
    import torch

    if device_specific:
        seed += _process_index()
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    if deterministic:
        torch.use_deterministic_algorithms(True)
    return seed


def _process_index() -> int:
    """This process's global index: the current run's, else the launcher's RANK variable."""
    from acc.runtime.worker import current

    run = current()
    return run.process_index if run is not None else int(os.environ.get("RANK", "0"))
