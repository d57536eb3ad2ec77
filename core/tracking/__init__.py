"""Experiment tracking (module `acc.tracking`, Accelerate's `accelerate.tracking`): the `GeneralTracker` base class,
tracker discovery through the entry-point group `acc.trackers`, and `Trackers`, the component an `Accelerator`
holds for `log_with=`, `init_trackers`, `log`, `trackers`, `get_tracker` and `end_training`.

A tracker is a `GeneralTracker` subclass (Accelerate's contract: `name`, `requires_logging_directory`, a `tracker`
property, `start`, `store_init_configuration`, `log`, `finish`). Installed trackers are entry points
`name = "module:Class"` in the group `acc.trackers`; the built-in `jsonl` tracker (acc.builtin.jsonl) needs no
dependency. Discovery reads entry-point metadata only; a tracker's module is imported when that tracker is chosen
(and its library, by convention, only in `start`). Torch-free.

Differences from Accelerate 1.15, on purpose: choosing a tracker that is not installed is an error with its install
command (Accelerate drops it with a debug message); a tracker that raises is switched off with a message naming it
and training continues; a tracker with `main_process_only = False` runs on every process (Accelerate's
`init_trackers` and `log` run on the main process only, whatever the tracker says).

The code lives in this package's modules: `base` (the tracker base class and `on_main_process`, what a tracker
author subclasses), `values` (what a tracker can store), `registry` (discovery, `log_with` choices, Accelerate's
`LOGGER_TYPE_TO_CLASS`) and `run` (`Trackers`, one per Accelerator); this module hands their names on, so a tracker
plugin imports `acc.tracking` and nothing else of acc.

The package imports the assembly (plugin discovery), the runtime (the process's place in the run) and the
contract; trackers import it, and the builtin `jsonl` tracker is found as theirs are.
"""

from __future__ import annotations

from typing import Any

from acc.tracking.base import GeneralTracker, TrackerError, on_main_process, say
from acc.tracking.registry import (
    BUILTIN_TRACKER,
    LOGGER_TYPE_TO_CLASS,
    TRACKER_GROUP,
    describe_setting,
    filter_trackers,
    get_available_trackers,
    installed_trackers,
    load_tracker_class,
    register_tracker_class,
    tracker_install_hint,
)
from acc.tracking.run import Trackers
from acc.tracking.values import NOT_SCALAR, Unstorable, describe, hyperparameters, scalar, split_values

_ACCELERATE_CLASSES = {"TensorBoardTracker": "tensorboard", "WandBTracker": "wandb", "MLflowTracker": "mlflow",
                       "CometMLTracker": "comet_ml", "AimTracker": "aim", "ClearMLTracker": "clearml",
                       "DVCLiveTracker": "dvclive", "SwanLabTracker": "swanlab", "TrackioTracker": "trackio"}


_UNINSTALLED: dict[str, type] = {}


def _uninstalled(class_name: str, tracker: str) -> type:
    """Accelerate's tracker class `class_name` for a tracker that is not installed: a GeneralTracker whose
    construction raises ImportError with the install command."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        raise ImportError(f"{class_name}: tracker '{tracker}' is not installed; {tracker_install_hint(tracker)}")

    return type(class_name, (GeneralTracker,), {"__init__": __init__, "name": tracker, "__module__": __name__,
                                                "requires_logging_directory": False,
                                                "__doc__": f"Tracker '{tracker}' (not installed here)."})


def __getattr__(name: str) -> Any:
    """Accelerate's tracker classes by their names (`from acc.tracking import TensorBoardTracker`), from the
    installed plugins; JSONLinesTracker is acc's own (acc.builtin.jsonl)."""
    if name == "JSONLinesTracker":  # the built-in tracker, found as every other tracker is
        return load_tracker_class(installed_trackers()[BUILTIN_TRACKER])
    if name in _ACCELERATE_CLASSES:
        tracker = _ACCELERATE_CLASSES[name]
        info = installed_trackers().get(tracker)
        if info is None:  # the name imports, as Accelerate's does without its library; building it says what is missing
            value = _UNINSTALLED.get(name) or _UNINSTALLED.setdefault(name, _uninstalled(name, tracker))
            return value
        return load_tracker_class(info)
    raise AttributeError(f"module 'acc.tracking' has no attribute {name!r}")


__all__ = [
    "BUILTIN_TRACKER", "GeneralTracker", "LOGGER_TYPE_TO_CLASS", "TRACKER_GROUP", "TrackerError", "Trackers",
    "describe_setting", "filter_trackers", "get_available_trackers", "installed_trackers", "load_tracker_class",
    "on_main_process", "register_tracker_class", "say", "tracker_install_hint",
    # for tracker authors (acc.tracking.values)
    "NOT_SCALAR", "Unstorable", "describe", "hyperparameters", "scalar", "split_values",
]
