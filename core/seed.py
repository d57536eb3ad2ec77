"""Seeding every random number generator a training run touches."""

from __future__ import annotations

import os
import random


def set_seed(seed: int, device_specific: bool = False) -> int:
    """Seed python's `random`, numpy (if installed) and torch (CPU and every accelerator).

    With `device_specific`, each process adds its rank (from the launcher's RANK variable) so processes
    draw different numbers (e.g. for dropout masks). Returns the seed used.
    """
    import torch

    if device_specific:
        seed += int(os.environ.get("RANK", "0"))
    random.seed(seed)
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds every CUDA device
    return seed
