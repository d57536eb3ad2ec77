"""The trackers of one run (`Trackers`, held by the Accelerator): what `log_with` chose, started by
`init_trackers`, fed by `log`, switched off with a message when one raises, closed by `end_training`."""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

from acc.tracking.base import GeneralTracker, TrackerError, say
from acc.tracking.registry import choose, log_with_items, plain_name


def _source(settings: Any) -> str:
    return settings.source("log_with") if hasattr(settings, "source") else "setting"


def _where(exc: BaseException) -> str:
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return f" (at {os.path.basename(tb.tb_frame.f_code.co_filename)}:{tb.tb_lineno})" if tb is not None else ""


class Trackers:
    """The trackers of one Accelerator: what `log_with` chose, started by `init`, fed by `log`, closed by `finish`.

    `log_with`: None (the `log_with` setting: --log-with, ACC_LOG_WITH, acc.toml), "all", a name, a LoggerType,
    a tracker object, or a list of them. `accelerator` is read for `is_main_process`, `logging_dir` (else
    `project_dir`) and `settings`. A tracker that raises is switched off with a message naming it; training goes on.
    """

    def __init__(self, log_with: Any, accelerator: Any):
        self._accelerator = accelerator
        where = "Accelerator(log_with=...)"
        settings = getattr(accelerator, "settings", None)
        has_setting = settings is not None and "log_with" in settings
        if log_with is None and has_setting:
            log_with = list(settings["log_with"])
            where = f"log_with ({_source(settings)})"
        elif has_setting and settings["log_with"] and not _source(settings).startswith("default"):
            given = [i if isinstance(i, str) else getattr(i, "name", i) for i in log_with_items(log_with)]
            if given != list(settings["log_with"]):
                import warnings

                warnings.warn(f"Accelerator(log_with={given!r}) overrides log_with={settings['log_with']!r} from "
                              f"{_source(settings)}", stacklevel=4)
        # Accelerate's leniency is for what a script's code names; acc's own log_with setting is always checked
        missing = settings["missing_tracker"] if settings is not None and "missing_tracker" in settings else "skip"
        if where != "Accelerator(log_with=...)":
            missing = "error"
        self.log_with, self._notes, self._classes = choose(log_with, self._logging_dir(), where, missing)
        self.trackers: list = []
        self.failed: dict[str, str] = {}
        self._initialized = self._finished = False
        self._said: set[str] = set()

    def _logging_dir(self) -> Any:
        acc = self._accelerator
        return getattr(acc, "logging_dir", None) or getattr(acc, "project_dir", None)

    def _is_main(self) -> bool:
        return bool(getattr(self._accelerator, "is_main_process", True))

    def _say_once(self, key: str, message: str) -> None:
        if key not in self._said:
            self._said.add(key)
            say(message)

    def _fail(self, tracker: Any, what: str, exc: Exception) -> None:
        name = str(getattr(tracker, "name", type(tracker).__name__))
        hint = ""
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            hint = f"; install with: pip install {exc.name.split('.')[0]}"
        message = (f"tracker '{name}' failed in {what}: {type(exc).__name__}: {exc}{_where(exc)}{hint}; it is "
                   "switched off for the rest of this run (training continues, the other trackers keep logging)")
        self.failed[name] = message
        if tracker in self.trackers:
            self.trackers.remove(tracker)
        say(message)

    def _call(self, tracker: Any, what: str, function: Callable, *args: Any, **kwargs: Any) -> Any:
        try:
            return function(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - a tracker's failure must not stop training; it is reported
            self._fail(tracker, what, exc)
            return None

    def init(self, project_name: str, config: Any = None, init_kwargs: dict | None = None) -> None:
        """`accelerator.init_trackers`: create and start the chosen trackers, then store `config` once."""
        if self._initialized:
            self._say_once("init-again", "init_trackers was called again: the trackers of the first call go on "
                           "logging, and hyper-parameters are stored once")
            return
        self._initialized = True
        init_kwargs = dict(init_kwargs or {})
        main = self._is_main()
        if main:
            for note in self._notes:
                say(note)
            chosen = {i if isinstance(i, str) else str(i.name) for i in self.log_with}
            for name in init_kwargs:
                if name not in chosen:
                    say(f"init_trackers(init_kwargs={{{name!r}: ...}}): no tracker '{name}' is chosen (chosen: "
                        f"{', '.join(sorted(chosen)) or 'none'}); ignored")
        logging_dir = self._logging_dir()
        for item in self.log_with:
            if isinstance(item, str):
                cls = self._classes[item]
                if not main and getattr(cls, "main_process_only", True):
                    continue
                kwargs = dict(init_kwargs.get(item, {}))
                args: tuple = (project_name,)
                if cls.requires_logging_directory:
                    if logging_dir is None:  # unset after the Accelerator was made
                        self._fail(cls, "__init__", TrackerError("it writes under a logging directory and none is set"))
                        continue
                    args = (project_name, os.fspath(logging_dir))
                elif getattr(cls, "accepts_logging_directory", False) and logging_dir is not None:
                    kwargs.setdefault("logging_dir", os.fspath(logging_dir))
                tracker = self._call(cls, "__init__", cls, *args, **kwargs)
                if tracker is None:
                    continue
            else:
                tracker = item
                if not main and getattr(tracker, "main_process_only", True):
                    continue
            self.trackers.append(tracker)
        for tracker in list(self.trackers):
            self._call(tracker, "start", tracker.start)
        if config is not None:
            if not isinstance(config, Mapping) and hasattr(config, "__dict__"):
                config = vars(config)  # an argparse.Namespace
            if isinstance(config, Mapping):  # no hf_token / api_key hyper-parameter reaches a tracker's files
                from acc.assembly.redact import redact_data

                config = redact_data(config)
            for tracker in list(self.trackers):
                self._call(tracker, "store_init_configuration", tracker.store_init_configuration, config)
        if self.trackers:
            # a script that ends without end_training, or with an exception, still closes them (their last lines
            # written): at its normal end (also in a forked worker), and at exit after a failure
            from acc.runtime import lifecycle

            def finish() -> None:  # holds this object: the script's own references may be gone by then
                self.finish()

            lifecycle.install(finish, also_on_failure=True)

    def log(self, values: Mapping, step: int | None = None, log_kwargs: dict | None = None) -> None:
        """`accelerator.log`: give `values` to every running tracker (a no-op where none runs)."""
        trackers = self.trackers
        if not trackers:
            return
        if self._finished:
            self._say_once("log-after-finish", "accelerator.log after end_training: the trackers are closed; ignored")
            return
        if type(values) is not dict and not isinstance(values, Mapping):
            raise TypeError(f"accelerator.log(values): values must be a dict of name -> value, got "
                            f"{type(values).__name__}")
        for tracker in tuple(trackers):
            kwargs = log_kwargs.get(tracker.name) if log_kwargs else None
            try:
                if kwargs:
                    tracker.log(values, step=step, **kwargs)
                else:
                    tracker.log(values, step=step)
            except Exception as exc:  # noqa: BLE001 - reported, the tracker switched off, training goes on
                self._fail(tracker, "log", exc)

    def get(self, name: str, unwrap: bool = False) -> Any:
        """`accelerator.get_tracker`: the tracker named `name` (its library's run object with `unwrap`); where no
        tracker runs (another process, or nothing chosen) a tracker that does nothing, as in Accelerate."""
        name = str(plain_name(name))
        for tracker in self.trackers:
            if tracker.name == name:
                return tracker.tracker if unwrap else tracker
        if name in self.failed:
            self._say_once(f"get-{name}", f"get_tracker({name!r}): that tracker failed earlier and is switched off; "
                           "returning a tracker that does nothing")
            return GeneralTracker(_blank=True)
        if self.trackers:
            raise ValueError(f"{name} is not an available tracker stored inside the `Accelerator`; running: "
                             f"{', '.join(str(t.name) for t in self.trackers)}")
        return GeneralTracker(_blank=True)

    def finish(self) -> None:
        """`end_training`: close every running tracker, once (later calls do nothing)."""
        if self._finished:
            return
        self._finished = True
        for tracker in tuple(self.trackers):
            self._call(tracker, "finish", tracker.finish)
