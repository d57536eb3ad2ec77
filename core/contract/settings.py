"""Settings as data: one declaration each (`Setting`), the registry of a run's settings, and the resolved values
with where each came from. The kernel's own settings and the resolution rule are `acc.assembly.settings`.

Every setting has one declaration (`Setting`), one converter, and one place its value came from (its
source), so `acc launch --dry-run` and error messages can say where a value was set. Torch-free.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Mapping

from acc.errors import PluginError, did_you_mean

CORE_OWNER = "acc"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


@dataclass(frozen=True)
class Setting:
    """One user-facing setting.

    `name` is the key in config files and, upper-cased with an `ACC_` prefix, the environment variable.
    `flags` are its `acc launch` options (empty: not a flag). `kind` is one of bool, int, float, str, list
    (a list of strings; comma-separated in flags and env). `choices` and `minimum`/`maximum` bound values.
    """

    name: str
    kind: type
    default: Any
    help: str
    flags: tuple[str, ...] = ()
    choices: tuple[str, ...] | None = None
    minimum: float | None = None
    maximum: float | None = None
    owner: str = CORE_OWNER
    presets: tuple[tuple[str, Any], ...] | None = None  # (semantics, default) pairs: a default per preset
    scoped: bool = False  # a plugin's own name: registered as "<plugin>.<name>" (see SettingsRegistry.add)
    refused: tuple[tuple[str, str], ...] = ()  # (value, why): values users ask for that are not offered, explained

    @property
    def env_var(self) -> str:
        return "ACC_" + self.name.replace(".", "_").upper()

    @property
    def key(self) -> str:
        """The name in a config file (within the owner's table for a plugin's setting)."""
        return self.name.rsplit(".", 1)[-1]

    @property
    def param(self) -> str:
        """The setting's name as a Python identifier (click's parameter name)."""
        return self.name.replace(".", "__")

    def describe_valid(self) -> str:
        """What values are valid, in words."""
        if self.choices:
            return "one of: " + ", ".join(self.choices)
        if self.kind is bool:
            return "true or false"
        if self.kind is list:
            return "a list of names (comma-separated in flags and environment variables)"
        noun = {int: "an integer", float: "a number", str: "a string"}[self.kind]
        if self.minimum is not None and self.maximum is not None:
            return f"{noun} from {_num(self.minimum)} to {_num(self.maximum)}"
        if self.minimum is not None:
            return f"{noun} >= {_num(self.minimum)}"
        return noun

    def convert(self, raw: Any) -> Any:
        """Turn a raw value (a string from a flag or env var, or a TOML value) into a typed value.

        Raises ValueError with a message that says what is valid.
        """
        try:
            value = self._convert(raw)
        except (TypeError, ValueError):
            raise ValueError(f"expected {self.describe_valid()}, got {raw!r}") from None
        why = dict(self.refused).get(value) if isinstance(value, str) else None
        if why is not None:
            raise ValueError(f"{raw!r} is not supported: {why} (expected {self.describe_valid()})")
        if self.choices and value not in self.choices:
            raise ValueError(f"expected {self.describe_valid()}, got {raw!r}{did_you_mean(str(value), self.choices)}")
        if self.kind is int and value is not None and not -(2**63) <= value < 2**64:
            raise ValueError(f"expected {self.describe_valid()} (one that fits in 64 bits), got {raw!r}")
        if self.kind is float and value is not None and not math.isfinite(value):
            raise ValueError(f"expected {self.describe_valid()} (a finite number), got {raw!r}")
        if self.kind in (int, float):
            if (self.minimum is not None and value < self.minimum) or (
                self.maximum is not None and value > self.maximum
            ):
                raise ValueError(f"expected {self.describe_valid()}, got {raw!r}")
        return value

    def _convert(self, raw: Any) -> Any:
        kind = self.kind
        if raw is None:
            return None
        if kind is bool:
            if isinstance(raw, bool):
                return raw
            if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
                return raw.strip().lower() in _TRUE
            raise ValueError
        if kind is int:
            if isinstance(raw, bool) or isinstance(raw, float):
                raise ValueError
            return int(raw.strip()) if isinstance(raw, str) else int(raw)
        if kind is float:
            if isinstance(raw, bool):
                raise ValueError
            return float(raw)
        if kind is list:
            if isinstance(raw, str):
                return [part.strip() for part in raw.split(",") if part.strip()]
            if isinstance(raw, (list, tuple)) and all(isinstance(x, str) for x in raw):
                return list(raw)
            raise ValueError
        if kind is str:
            if not isinstance(raw, str):
                raise ValueError
            return raw
        raise TypeError(f"unsupported setting kind {kind!r}")


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else str(x)


class SettingsRegistry:
    """The settings a plugin set declares; names and flags are unique across plugins."""

    def __init__(self) -> None:
        self._by_name: dict[str, Setting] = {}
        self._flag_owner: dict[str, str] = {}

    def add(self, setting: Setting, owner: str | None = None) -> Setting:
        """Declare a setting; `owner` (the plugin name) defaults to the setting's own."""
        if owner is not None:
            setting = replace(setting, owner=owner)
        short = setting.name
        if not short.isidentifier() or short != short.lower() or "__" in short:
            raise PluginError(f"plugin '{setting.owner}' declares setting {short!r}: names are lower_snake_case")
        if setting.scoped and "." not in short:
            if setting.owner == CORE_OWNER:
                raise PluginError(f"setting '{short}': only a plugin's settings can be scoped")
            setting = replace(setting, name=f"{setting.owner}.{short}",
                              flags=setting.flags or (f"--{setting.owner.replace('_', '-')}-{short.replace('_', '-')}",))
        if setting.kind not in (bool, int, float, str, list):
            raise PluginError(f"plugin '{setting.owner}' declares setting '{setting.name}' of kind {setting.kind!r}; "
                              "valid kinds: bool, int, float, str, list")
        other = self._by_name.get(setting.name)
        if other is not None:
            raise PluginError(
                f"setting '{setting.name}' is declared by both '{other.owner}' and '{setting.owner}'; "
                "a setting name must be unique across the loaded plugins"
            )
        for flag in setting.flags:
            if flag in self._flag_owner:
                raise PluginError(
                    f"flag {flag} is declared by both '{self._flag_owner[flag]}' and '{setting.owner}'"
                )
        self._by_name[setting.name] = setting
        for flag in setting.flags:
            self._flag_owner[flag] = setting.owner
        return setting

    def scoped(self, owner: str) -> "ScopedRegistry":
        """A view that stamps `owner` on every setting added through it (what a plugin's hook receives)."""
        return ScopedRegistry(self, owner)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Setting:
        return self._by_name[name]

    def __iter__(self) -> Iterator[Setting]:
        return iter(self._by_name.values())

    def names(self) -> list[str]:
        return list(self._by_name)

    def owned_by(self, owner: str) -> list[Setting]:
        return [s for s in self._by_name.values() if s.owner == owner]


@dataclass
class ScopedRegistry:
    """What `acc_add_settings` receives: `add(Setting(...))` records the calling plugin as owner."""

    registry: SettingsRegistry
    owner: str

    def add(self, setting: Setting) -> Setting:
        return self.registry.add(setting, owner=self.owner)


@dataclass
class ResolvedSettings(Mapping[str, Any]):
    """Typed setting values with the source of each (`'flag --nproc'`, `'env ACC_NPROC'`, `'default'`...)."""

    values: dict[str, Any]  # type: ignore[assignment]  # acc 0.1's field: the dict of values (Mapping.values() is not offered)
    sources: dict[str, str] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        try:
            return self.values[name]
        except KeyError:
            raise KeyError(f"no setting named {name!r}; known: {', '.join(sorted(self.values))}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self.values)

    def __len__(self) -> int:
        return len(self.values)

    def source(self, name: str) -> str:
        return self.sources.get(name, "default")

    def of(self, owner: str) -> dict[str, Any]:
        """A plugin's scoped settings by their short names (`settings.of("localsgd")["sync_every"]`)."""
        prefix = owner + "."
        return {name[len(prefix):]: value for name, value in self.values.items() if name.startswith(prefix)}

    def is_default(self, name: str) -> bool:
        """True when nobody set it: the plain default or the default of the semantics preset."""
        return self.source(name).startswith("default")

    def override(self, name: str, value: Any, source: str,
                 registry: "SettingsRegistry | None" = None) -> "ResolvedSettings":
        """A copy with one value replaced (e.g. an `Accelerator(...)` argument, source 'code'); with `registry`,
        settings that default from the changed one (the `semantics` preset) follow it."""
        values, sources = dict(self.values), dict(self.sources)
        values[name], sources[name] = value, source
        if registry is not None:
            apply_presets(registry, values, sources)
        return ResolvedSettings(values, sources)

    def to_json(self) -> str:
        return json.dumps({"values": self.values, "sources": self.sources}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "ResolvedSettings":
        data = json.loads(text)
        return cls(dict(data["values"]), dict(data["sources"]))


SEMANTICS = ("accelerate", "acc")


def apply_presets(registry: SettingsRegistry, values: dict[str, Any], sources: dict[str, str]) -> None:
    """Give every setting that nobody set the default of the chosen `semantics` preset (source says so)."""
    preset = values.get("semantics", SEMANTICS[0])
    for setting in registry:
        if setting.presets and sources.get(setting.name, "default").startswith("default"):
            values[setting.name] = dict(setting.presets).get(preset, setting.default)
            sources[setting.name] = f"default of semantics={preset}"
