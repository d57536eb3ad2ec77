"""The Accelerator's tracking methods (`log_with=`, `init_trackers`, `log`, `trackers`, `get_tracker`), over the run's
`Trackers` (`acc.tracking.run`), made when first needed."""

from __future__ import annotations

from typing import Any


class TrackingMethods:
    """Mixed into `acc.accelerator.Accelerator`, which sets `_log_with` (its argument) and `_tracking` (None)."""

    _log_with: Any
    _tracking: Any

    def _trackers(self) -> Any:
        if self._tracking is None:
            from acc.tracking import Trackers

            self._tracking = Trackers(self._log_with, self)
        return self._tracking

    @property
    def trackers(self) -> list:
        """The trackers this process logs to (none on processes that do not log)."""
        return self._trackers().trackers if (self._tracking or self._log_with is not None) else []

    @property
    def log_with(self) -> list:
        return self._trackers().log_with if (self._tracking or self._log_with is not None) else []

    def init_trackers(self, project_name: str, config: dict | None = None, init_kwargs: dict | None = None) -> None:
        """Start a run in every chosen tracker (on the processes that log), with the hyper-parameters `config`."""
        self._trackers().init(project_name, config=config, init_kwargs=init_kwargs)

    def log(self, values: dict, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """Log scalar `values` at `step` to every tracker."""
        self._trackers().log(values, step=step, log_kwargs=log_kwargs)

    def get_tracker(self, name: str, unwrap: bool = False) -> Any:
        """The tracker called `name` (with `unwrap`, its library's own run object)."""
        return self._trackers().get(name, unwrap=unwrap)
