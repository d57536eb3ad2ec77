"""The prepared-objects registry: what `prepare` returned and `register_for_checkpointing` added, in order.

One instance per Accelerator. The checkpointer (saving.py) saves and restores what it lists, `free_memory` empties
it, and the backend's hooks never see it (they get the objects themselves).
"""

from __future__ import annotations

import collections
from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass
class PreparedObjects:
    """The prepared models, optimizers, schedulers and data loaders; the registered objects; the save/load
    pre-hooks (`register_save_state_pre_hook`), keyed by their handles' ids."""

    models: list[Any] = field(default_factory=list)
    optimizers: list[Any] = field(default_factory=list)  # AcceleratedOptimizer
    schedulers: list[Any] = field(default_factory=list)  # AcceleratedScheduler
    dataloaders: list[Any] = field(default_factory=list)  # PreparedDataLoader
    custom_objects: list[Any] = field(default_factory=list)
    # OrderedDicts, as torch's RemovableHandle keeps a weak reference to the registry it removes itself from
    save_hooks: collections.OrderedDict[int, Callable[..., None]] = field(default_factory=collections.OrderedDict)
    load_hooks: collections.OrderedDict[int, Callable[..., None]] = field(default_factory=collections.OrderedDict)

    def register(self, *objects: Any) -> None:
        """Add objects to save and restore with the state (each needs state_dict and load_state_dict)."""
        bad = [f"Item at index {i} ({type(o).__name__})" for i, o in enumerate(objects)
               if not (callable(getattr(o, "state_dict", None)) and callable(getattr(o, "load_state_dict", None)))]
        if bad:  # a ValueError, as Accelerate raises
            raise ValueError(f"register_for_checkpointing: {', '.join(bad)} lack(s) state_dict() and "
                             "load_state_dict(); wrap each in an object that has both")
        self.custom_objects.extend(objects)

    def release(self) -> None:
        """Forget the prepared objects (free_memory); registered objects and hooks stay."""
        self.models, self.optimizers, self.schedulers, self.dataloaders = [], [], [], []
