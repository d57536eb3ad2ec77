"""Experiment tracking (module `acc.tracking`, Accelerate's `accelerate.tracking`): the `GeneralTracker` base class,
tracker discovery through the entry-point group `acc.trackers`, and `Trackers`, the component an `Accelerator`
holds for `log_with=`, `init_trackers`, `log`, `trackers`, `get_tracker` and `end_training`.

A tracker is a `GeneralTracker` subclass (Accelerate's contract: `name`, `requires_logging_directory`, a `tracker`
property, `start`, `store_init_configuration`, `log`, `finish`). Installed trackers are entry points
`name = "module:Class"` in the group `acc.trackers`; the built-in `jsonl` tracker (acc.tracker_jsonl) needs no
dependency. Discovery reads entry-point metadata only; a tracker's module is imported when that tracker is chosen
(and its library, by convention, only in `start`). Torch-free.

Differences from Accelerate 1.15, on purpose: choosing a tracker that is not installed is an error with its install
command (Accelerate drops it with a debug message); a tracker that raises is switched off with a message naming it
and training continues; a tracker with `main_process_only = False` runs on every process (Accelerate's
`init_trackers` and `log` run on the main process only, whatever the tracker says).
"""

from __future__ import annotations

import enum
import functools
import os
import sys
from typing import Any, Callable, Iterator, Mapping

from acc.errors import PluginError, did_you_mean
from acc.assembly.plugins import PluginInfo, _discover, module_available, plugin_requires
from acc.tracker_values import NOT_SCALAR, Unstorable, describe, hyperparameters, scalar, split_values

TRACKER_GROUP = "acc.trackers"
BUILTIN_TRACKER = "jsonl"
BUILTIN_VALUE = "acc.tracker_jsonl:JSONLinesTracker"
# first-party tracker plugins: name -> distribution (its install command names it)
FIRST_PARTY_TRACKERS = {"tensorboard": "acc-tensorboard", "mlflow": "acc-mlflow", "wandb": "acc-wandb"}


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


def on_main_process(function: Callable) -> Callable:
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

    def store_init_configuration(self, values: dict) -> None:
        """Store `values` (str -> bool, str, int, float or None) as the run's hyper-parameters."""

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """Log `values` (str -> int, float or str) at `step`."""

    def finish(self) -> None:
        """Close the run (called by `end_training`)."""


# ---------------------------------------------------------------------------------------------- discovery
_REGISTERED: dict[str, type] = {}  # register_tracker_class(): classes known by name in this process


def installed_trackers() -> dict[str, PluginInfo]:
    """Installed trackers by name (the built-in jsonl first), read from entry-point metadata without importing."""
    from acc.assembly.plugins import _core_version

    builtin = PluginInfo(BUILTIN_TRACKER, TRACKER_GROUP, BUILTIN_VALUE, "acc-core", _core_version())
    found = {k: v for k, v in sorted(_discover(TRACKER_GROUP).items()) if k != BUILTIN_TRACKER}
    return {BUILTIN_TRACKER: builtin, **found}


def tracker_install_hint(name: str) -> str:
    if name in FIRST_PARTY_TRACKERS:
        return f"install with: pip install {FIRST_PARTY_TRACKERS[name]}"
    return (f"acc has no '{name}' tracker of its own: a tracker is a package that declares an entry point in the "
            f"group '{TRACKER_GROUP}' (name = \"module:TrackerClass\"), or pass a GeneralTracker object: "
            "log_with=[MyTracker(...)]")


def load_tracker_class(info: PluginInfo) -> type:
    """Import an installed tracker's module and return its class (checked: a tracker named as its entry point)."""
    module_name, _, attr = info.module.partition(":")
    module = info.load_module()
    cls = getattr(module, attr, None) if attr else getattr(module, "TRACKER", None)
    where = f"tracker '{info.name}' ({info.distribution} {info.version}, entry point {info.module})"
    if not isinstance(cls, type):
        raise TrackerError(f"{where}: {module_name} has no tracker class {attr or 'TRACKER'!r}")
    for required in ("name", "requires_logging_directory"):
        if not hasattr(cls, required):
            raise TrackerError(f"{where}: {cls.__name__} does not define `{required}`")
    if cls.name != info.name:
        raise TrackerError(f"{where}: the class is named {cls.name!r}; a tracker's `name` must be its entry-point "
                           "name (get_tracker and log_kwargs find it by that name)")
    return cls


def _class_for(name: str) -> type:
    """The tracker class for `name`: a registered class first, then an installed tracker (imported now)."""
    if name in _REGISTERED:
        return _REGISTERED[name]
    infos = installed_trackers()
    if name not in infos:
        raise TrackerError(f"tracker '{name}' is not installed{did_you_mean(name, list(infos))}; installed: "
                           f"{', '.join(infos)}; {tracker_install_hint(name)}")
    return load_tracker_class(infos[name])


def _missing_modules(cls: type) -> list[str]:
    return [m for m in plugin_requires(cls) if not module_available(m)]


class _TrackerClasses(Mapping):
    """Accelerate's `LOGGER_TYPE_TO_CLASS`: tracker name -> class, over the installed and registered trackers
    (a class is imported when it is looked up)."""

    def __getitem__(self, name: Any) -> type:
        name = _plain(name)
        if name not in self:
            raise KeyError(name)
        return _class_for(name)

    def __contains__(self, name: object) -> bool:
        name = _plain(name)
        return name in _REGISTERED or name in installed_trackers()

    def __iter__(self) -> Iterator[str]:
        return iter(dict.fromkeys([*installed_trackers(), *_REGISTERED]))

    def __len__(self) -> int:
        return len(list(iter(self)))


LOGGER_TYPE_TO_CLASS = _TrackerClasses()


def register_tracker_class(tracker_class: type) -> None:
    """Make a GeneralTracker subclass known by its `name` in `log_with` (Accelerate's `register_tracker_class`)."""
    import warnings

    if not (isinstance(tracker_class, type) and issubclass(tracker_class, GeneralTracker)):
        raise ValueError(f"`tracker_class` must be a subclass of `GeneralTracker`, but got {tracker_class}.")
    if not getattr(tracker_class, "name", None):
        raise ValueError("The tracker class to register must define a non-empty `name` attribute.")
    if not hasattr(tracker_class, "requires_logging_directory"):
        raise ValueError("The tracker class to register must define a `requires_logging_directory` class attribute. "
                         "Set it to `True` if the tracker needs a logging directory, or `False` otherwise.")
    if tracker_class.name in LOGGER_TYPE_TO_CLASS:
        warnings.warn(f"A tracker with the name '{tracker_class.name}' is already registered and will be overwritten "
                      f"by {tracker_class}.", stacklevel=2)
    _REGISTERED[tracker_class.name] = tracker_class


def get_available_trackers() -> list:
    """Every installed tracker (Accelerate's function): LoggerType members where Accelerate has one, else names."""
    from acc.contract.enums import LoggerType

    return [LoggerType(n) if n in LoggerType else n for n in installed_trackers()]


def _plain(item: Any) -> Any:
    return item.value if isinstance(item, enum.Enum) else item


def _is_tracker_object(item: Any) -> bool:
    return isinstance(item, GeneralTracker) or (
        not isinstance(item, (str, type)) and hasattr(item, "name") and callable(getattr(item, "log", None)))


def _items(log_with: Any) -> list:
    """`log_with` as a list; LoggerType members as their names; "a,b" (a repeated list flag) as two names."""
    items = log_with if isinstance(log_with, (list, tuple)) else ([] if log_with is None else [log_with])
    out: list = []
    for item in map(_plain, items):
        out += [part.strip() for part in item.split(",") if part.strip()] if isinstance(item, str) else [item]
    return out


def choose(log_with: Any, logging_dir: Any, where: str = "log_with") -> tuple[list, list[str], dict[str, type]]:
    """The trackers `log_with` names, in its order: a list of names and tracker objects (duplicates dropped;
    "all" stands for every installed tracker not named otherwise), notes about trackers that "all" left out, and
    the class of each name. Raises TrackerError for a name that is not installed or cannot run here."""
    items = _items(log_with)
    for item in items:
        if isinstance(item, type):
            raise TrackerError(f"{where}: {item.__name__} is a class; pass a tracker object ({item.__name__}(...)), "
                               "or its name after register_tracker_class")
        if not isinstance(item, str) and not _is_tracker_object(item):
            raise TrackerError(f"{where}: {item!r} is neither a tracker name nor a tracker object (GeneralTracker)")
    named = {item if isinstance(item, str) else str(item.name) for item in items}
    chosen: list = []
    notes: list[str] = []
    classes: dict[str, type] = {}
    taken: set[str] = set()
    for item in items:
        if not isinstance(item, str):
            if str(item.name) not in taken:
                chosen.append(item)
                taken.add(str(item.name))
        elif item == "all":
            for name in [*installed_trackers(), *_REGISTERED]:
                if name in named or name in taken:
                    continue  # named on its own: checked there
                cls = _class_for(name)
                missing = _missing_modules(cls)
                if missing:
                    notes.append(f"log_with 'all' leaves out tracker '{name}': it needs {', '.join(missing)} "
                                 f"(pip install {' '.join(missing)})")
                elif cls.requires_logging_directory and logging_dir is None:
                    notes.append(f"log_with 'all' leaves out tracker '{name}': it writes under a logging directory "
                                 "and none is set (Accelerator(project_dir=...))")
                else:
                    chosen.append(name)
                    taken.add(name)
                    classes[name] = cls
        elif item not in taken:
            try:
                cls = _class_for(item)
            except TrackerError as exc:
                raise TrackerError(f"{where}: {exc}") from None
            missing = _missing_modules(cls)
            if missing:
                raise TrackerError(f"{where}: tracker '{item}' needs {', '.join(missing)}, which is not installed; "
                                   f"install with: pip install {' '.join(missing)}")
            if cls.requires_logging_directory and logging_dir is None:
                raise TrackerError(f"{where}: logging with `{item}` requires a `logging_dir` to be passed in: give "
                                   "Accelerator(project_dir=...) or ProjectConfiguration(logging_dir=...)")
            chosen.append(item)
            taken.add(item)
            classes[item] = cls
    return chosen, notes, classes


def filter_trackers(log_with: Any, logging_dir: Any = None) -> list:
    """Accelerate's `filter_trackers`: the trackers `log_with` chooses (names and tracker objects)."""
    return choose(log_with, logging_dir)[0]


def describe_setting(names: list[str]) -> str:
    """The `log_with` setting in words for `acc launch --dry-run`, from entry-point metadata only."""
    if not names:
        return "none (Accelerator(log_with=...) in the script may choose)"
    infos = installed_trackers()
    shown = []
    for name in dict.fromkeys(_items(names)):
        if name == "all":
            shown.append(f"all = {', '.join(infos)}")
        elif name in infos:
            shown.append(f"{name} ({infos[name].distribution} {infos[name].version})")
        else:
            shown.append(f"{name} (NOT installed: {tracker_install_hint(name)})")
    return ", ".join(shown)


# ---------------------------------------------------------------------------------------------- the component
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
            given = [i if isinstance(i, str) else getattr(i, "name", i) for i in _items(log_with)]
            if given != list(settings["log_with"]):
                import warnings

                warnings.warn(f"Accelerator(log_with={given!r}) overrides log_with={settings['log_with']!r} from "
                              f"{_source(settings)}", stacklevel=4)
        self.log_with, self._notes, self._classes = choose(log_with, self._logging_dir(), where)
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
        name = str(_plain(name))
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


_ACCELERATE_CLASSES = {"TensorBoardTracker": "tensorboard", "WandBTracker": "wandb", "MLflowTracker": "mlflow",
                       "CometMLTracker": "comet_ml", "AimTracker": "aim", "ClearMLTracker": "clearml",
                       "DVCLiveTracker": "dvclive", "SwanLabTracker": "swanlab", "TrackioTracker": "trackio"}


def __getattr__(name: str) -> Any:
    """Accelerate's tracker classes by their names (`from acc.tracking import TensorBoardTracker`), from the
    installed plugins; JSONLinesTracker is acc's own."""
    if name == "JSONLinesTracker":
        from acc.tracker_jsonl import JSONLinesTracker

        return JSONLinesTracker
    if name in _ACCELERATE_CLASSES:
        tracker = _ACCELERATE_CLASSES[name]
        info = installed_trackers().get(tracker)
        if info is None:
            raise ImportError(f"cannot import {name} from acc.tracking: tracker '{tracker}' is not installed; "
                              f"{tracker_install_hint(tracker)}")
        return load_tracker_class(info)
    raise AttributeError(f"module 'acc.tracking' has no attribute {name!r}")


__all__ = [
    "BUILTIN_TRACKER", "GeneralTracker", "LOGGER_TYPE_TO_CLASS", "TRACKER_GROUP", "TrackerError", "Trackers",
    "describe_setting", "filter_trackers", "get_available_trackers", "installed_trackers", "load_tracker_class",
    "on_main_process", "register_tracker_class", "say", "tracker_install_hint",
    # for tracker authors (acc.tracker_values)
    "NOT_SCALAR", "Unstorable", "describe", "hyperparameters", "scalar", "split_values",
]
