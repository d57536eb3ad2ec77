"""Which trackers exist and which a run uses: discovery through the entry-point group `acc.trackers` (metadata
only; the built-in `jsonl` first), the classes by name (Accelerate's `LOGGER_TYPE_TO_CLASS`,
`register_tracker_class`), and the choice `log_with` makes (names, "all", LoggerType values, tracker objects), with
an install command for a tracker that is not installed. Torch-free."""

from __future__ import annotations

import enum
from typing import Any, Iterator, MutableMapping

from acc.assembly.plugins import PluginInfo, _discover, module_available, plugin_requires
from acc.errors import did_you_mean
from acc.tracking.base import GeneralTracker, TrackerError

_REGISTERED: dict[str, type] = {}  # register_tracker_class(): classes known by name in this process


TRACKER_GROUP = "acc.trackers"
BUILTIN_TRACKER = "jsonl"
BUILTIN_VALUE = "acc.builtin.jsonl:JSONLinesTracker"


# first-party tracker plugins: name -> distribution (its install command names it)
FIRST_PARTY_TRACKERS = {"tensorboard": "acc-tensorboard", "mlflow": "acc-mlflow", "wandb": "acc-wandb"}


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


class _TrackerClasses(MutableMapping):
    """Accelerate's `LOGGER_TYPE_TO_CLASS`: tracker name -> class, over the installed and registered trackers
    (a class is imported when it is looked up). Setting a name registers a class (as `register_tracker_class`
    does, unchecked); deleting one (or `clear()`) takes it out of this mapping, so a test can snapshot and
    restore it as Accelerate's tests do with their dict."""

    def __init__(self) -> None:
        self._hidden: set[str] = set()  # installed trackers deleted from the mapping

    def __getitem__(self, name: Any) -> type:
        name = plain_name(name)
        if name not in self:
            raise KeyError(name)
        return _class_for(name)

    def __setitem__(self, name: Any, tracker_class: type) -> None:
        name = plain_name(name)
        _REGISTERED[name] = tracker_class
        self._hidden.discard(name)

    def __delitem__(self, name: Any) -> None:
        name = plain_name(name)
        if name not in self:
            raise KeyError(name)
        _REGISTERED.pop(name, None)
        if name in installed_trackers():
            self._hidden.add(name)

    def clear(self) -> None:
        _REGISTERED.clear()
        self._hidden.update(installed_trackers())

    def __contains__(self, name: object) -> bool:
        name = plain_name(name)
        return name in _REGISTERED or (name in installed_trackers() and name not in self._hidden)

    def __iter__(self) -> Iterator[str]:
        return iter([n for n in dict.fromkeys([*installed_trackers(), *_REGISTERED]) if n in self])

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
    LOGGER_TYPE_TO_CLASS[tracker_class.name] = tracker_class


def get_available_trackers() -> list:
    """Every installed tracker (Accelerate's function): LoggerType members where Accelerate has one, else names."""
    from acc.contract.enums import LoggerType

    return [LoggerType(n) if n in LoggerType else n for n in installed_trackers()]


def plain_name(item: Any) -> Any:
    return item.value if isinstance(item, enum.Enum) else item


def _is_tracker_object(item: Any) -> bool:
    return isinstance(item, GeneralTracker) or (
        not isinstance(item, (str, type)) and hasattr(item, "name") and callable(getattr(item, "log", None)))


def log_with_items(log_with: Any) -> list:
    """`log_with` as a list; LoggerType members as their names; "a,b" (a repeated list flag) as two names."""
    items = log_with if isinstance(log_with, (list, tuple)) else ([] if log_with is None else [log_with])
    out: list = []
    for item in map(plain_name, items):
        out += [part.strip() for part in item.split(",") if part.strip()] if isinstance(item, str) else [item]
    return out


def choose(log_with: Any, logging_dir: Any, where: str = "log_with",
           missing: str = "skip") -> tuple[list, list[str], dict[str, type]]:
    """The trackers `log_with` names, in its order: a list of names and tracker objects (duplicates dropped;
    "all" stands for every installed tracker not named otherwise), notes about trackers left out, and the class of
    each name. A tracker Accelerate knows (a LoggerType) that is not installed here is left out with a note when
    `missing` is "skip" (Accelerate's `filter_trackers` drops it); with "error", and for any other name, it raises
    TrackerError, as for a tracker that cannot run here."""
    from acc.contract.enums import LoggerType

    known = {member.value for member in LoggerType}
    items = log_with_items(log_with)
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
                absent = _missing_modules(cls)
                if absent:
                    raise TrackerError(f"tracker '{item}' needs {', '.join(absent)}, which is not installed; "
                                       f"install with: pip install {' '.join(absent)}")
            except TrackerError as exc:
                if missing == "skip" and item in known:
                    notes.append(f"{where}: {exc}; it is left out, as Accelerate leaves out a tracker that is not "
                                 "installed (missing_tracker = error, or --semantics acc, makes this an error)")
                    taken.add(item)
                    continue
                raise TrackerError(f"{where}: {exc}") from None
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
    for name in dict.fromkeys(log_with_items(names)):
        if name == "all":
            shown.append(f"all = {', '.join(infos)}")
        elif name in infos:
            shown.append(f"{name} ({infos[name].distribution} {infos[name].version})")
        else:
            shown.append(f"{name} (NOT installed: {tracker_install_hint(name)})")
    return ", ".join(shown)
