"""What a tracker author subclasses: `GeneralTracker` (Accelerate's contract), `on_main_process` for methods that
run on the main process only, `say` for a one-line note to the user, and `TrackerError`. Torch-free."""

from __future__ import annotations

import functools
import os
import sys
from typing import Any, Callable

from acc.errors import PluginError


class TrackerError(PluginError, ValueError):
    """A tracker cannot be chosen (not installed, needs a logging directory, not a tracker). A ValueError, as
    Accelerate's own errors for these cases are."""


def say(message: str) -> None:
    """One line for the user on stderr, prefixed like acc's other run-time notes."""
    print(f"acc: {message}", file=sys.stderr, flush=True)


def _is_main_process() -> bool:
    from acc.runtime import worker as runtime

    run = runtime.current()
    if run is not None:
        return run.process_index == 0
    return int(os.environ.get("RANK", "0")) == 0


def on_main_process(function: Callable[..., Any]) -> Callable[..., Any]:
    """Decorator for tracker methods (Accelerate's `accelerate.tracking.on_main_process`): the method runs on the
    main process only when the tracker's `main_process_only` is true, on every process otherwise."""

    @functools.wraps(function)
    def execute_on_main_process(self: Any, *args: Any, **kwargs: Any) -> Any:
        if getattr(self, "main_process_only", False) and not _is_main_process():
            return None
        return function(self, *args, **kwargs)

    return execute_on_main_process


class GeneralTracker:
    """The base class of every tracker, with Accelerate's contract, so a tracker written for Accelerate works.

    A subclass defines `name` (str), `requires_logging_directory` (bool: the logging directory is then the second
    positional argument of its constructor, after the project name) and a `tracker` property (the library's own
    run object, what `get_tracker(name, unwrap=True)` returns), and overrides `start` (open the run: called by
    `init_trackers`), `store_init_configuration(values)` (hyper-parameters, once), `log(values, step=None,
    **kwargs)` and `finish()`. `main_process_only` (default True) runs it on the main process only.

    acc's optional additions: `ACC_REQUIRES` (modules the tracker imports, checked without importing them when it
    is chosen) and `accepts_logging_directory` (True: given `logging_dir=` when one is known, though not required).
    """

    main_process_only = True

    def __init__(self, _blank: bool = False):
        if _blank:
            return
        missing = [f"`{attr}`" for attr in ("name", "requires_logging_directory") if not hasattr(self, attr)]
        if "tracker" not in dir(self):  # a property that may depend on start(): look it up without calling it
            missing.append("`tracker`")
        if missing:
            raise NotImplementedError(
                "The implementation for this tracker class is missing the following required attributes. Please "
                f"define them in the class definition: {', '.join(missing)}")

    def start(self) -> None:
        """Open the run (called by `init_trackers`, after the process group exists)."""

    def store_init_configuration(self, values: dict[str, Any]) -> None:
        """Store `values` (str -> bool, str, int, float or None) as the run's hyper-parameters."""

    def log(self, values: dict[str, Any], step: int | None = None, **kwargs: Any) -> None:
        """Log `values` (str -> int, float or str) at `step`."""

    def finish(self) -> None:
        """Close the run (called by `end_training`)."""
