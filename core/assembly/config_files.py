"""Config files: TOML, read with the standard library. Torch-free.

Layout of a file (project `./acc.toml`, user `~/.config/acc/config.toml`, or `--config-file PATH`):

    backend = "ddp"            # kernel settings at the top level
    nproc = 2
    mixed_precision = "bf16"

    [deepspeed]                # a plugin's settings in a table named after the plugin
    zero_stage = 2

Tables for plugins that are not loaded in this run are ignored; unknown keys anywhere else are errors.

A file given with `--config-file` may also be an Accelerate config (YAML or JSON, what `accelerate config`
writes): it is recognised by its name (.yaml, .yml, .json) or its `key: value` lines and read with Accelerate's
meaning (`acc.compat.accelerate_launch`).
"""

from __future__ import annotations

import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

from acc.contract.settings import CORE_OWNER, Setting, SettingsRegistry
from acc.errors import ConfigError, did_you_mean

PROJECT_FILE = "acc.toml"


def user_config_path(environ: Mapping[str, str] = os.environ) -> Path:
    """`$ACC_CONFIG_HOME/config.toml`, else `$XDG_CONFIG_HOME/acc/config.toml`, else `~/.config/acc/config.toml`."""
    if environ.get("ACC_CONFIG_HOME"):
        return Path(environ["ACC_CONFIG_HOME"]) / "config.toml"
    base = environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "acc" / "config.toml"


@dataclass
class ConfigFile:
    """A parsed config file; `label` says which layer it is ('project file', 'user file', 'config file')."""

    path: Path
    label: str
    data: dict[str, Any]
    text: str = ""
    _lines: list[str] = field(default_factory=list, repr=False)
    # an Accelerate config: each acc setting's Accelerate key, notes about it, num_processes over all machines
    accelerate: bool = False
    origin: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    total_processes: int | None = None
    total_machines: int = 1  # the machines its num_processes was divided by (its own num_machines, else 1)

    @classmethod
    def read(cls, path: Path, label: str) -> "ConfigFile":
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"{label} {path}: cannot be read ({exc.strerror or exc})") from None
        except UnicodeDecodeError as exc:
            raise ConfigError(f"{label} {path}: not UTF-8 text (byte {exc.object[exc.start]:#04x} at offset "
                              f"{exc.start}); a config file is TOML (or an Accelerate YAML config) written in "
                              "UTF-8") from None
        if is_accelerate_config(path, text):
            from acc.compat import accelerate_config

            try:
                converted = accelerate_config.read_config(path, label, text)
            except RecursionError:
                raise ConfigError(f"{label} {path}: nested too deeply to be a config file") from None
            return cls(path=path, label=label, data=converted.data, text=text, _lines=text.splitlines(),
                       accelerate=True, origin=converted.origin, notes=converted.notes,
                       total_processes=converted.total_processes, total_machines=converted.machines)
        try:
            data = tomllib.loads(text)
        except RecursionError:
            raise ConfigError(f"{label} {path}: not valid TOML: nested too deeply to be a config file") from None
        except tomllib.TOMLDecodeError as exc:
            # the message ends with "(at line L, column C)"
            raise ConfigError(
                f"{label} {path}: not valid TOML: {exc}. "
                "The file holds `key = value` lines, plugin settings under a [plugin] table."
            ) from None
        return cls(path=path, label=label, data=data, text=text, _lines=text.splitlines())

    def lookup(self, setting: Setting) -> tuple[bool, Any]:
        """(True, raw value) where this file sets `setting`, else (False, None)."""
        table = self.data if setting.owner == CORE_OWNER else self.data.get(setting.owner)
        if isinstance(table, dict) and setting.key in table and not isinstance(table[setting.key], dict):
            return True, table[setting.key]
        return False, None

    def line_of(self, key: str, table: str | None = None) -> int | None:
        """1-based line where `key` is assigned (inside `[table]` when given), if it can be found."""
        if self.accelerate:  # YAML: the line of the Accelerate key the setting came from
            leaf = self.origin.get(key, key).split("+")[0].rsplit(".", 1)[-1]
            pattern = re.compile(r"""^\s*["']?%s["']?\s*:""" % re.escape(leaf))
            return next((n for n, line in enumerate(self._lines, 1) if pattern.match(line)), None)
        current: str | None = None
        pattern = re.compile(r"""^\s*["']?%s["']?\s*=""" % re.escape(key))
        for number, line in enumerate(self._lines, 1):
            header = re.match(r"^\s*\[\s*([^\]]+?)\s*\]", line)
            if header:
                current = header.group(1).strip("\"'")
                continue
            if current == table and pattern.match(line):
                return number
        return None

    def where(self, key: str, table: str | None = None) -> str:
        line = self.line_of(key, table)
        return f"{self.label} {self.path}" + (f", line {line}" if line else "")

    def describe_key(self, setting: Setting, problem: str) -> str:
        table = None if setting.owner == CORE_OWNER else setting.owner
        shown = f"[{table}] {setting.key}" if table else setting.key
        if self.accelerate:
            shown = f"{self.origin.get(setting.name, setting.name)}' (acc's {setting.name}"
            return f"{self.where(setting.key, table)}: key '{shown}): {problem}"
        return f"{self.where(setting.key, table)}: key '{shown}': {problem}"

    def check_keys(self, registry: SettingsRegistry, loaded_plugins: set[str]) -> None:
        """Raise ConfigError for a key no loaded plugin declares (tables of unloaded plugins are skipped)."""
        core = {s.name for s in registry.owned_by(CORE_OWNER)}
        for key, value in self.data.items():
            if isinstance(value, dict):
                if key not in loaded_plugins:
                    continue
                own = {s.key for s in registry.owned_by(key)}
                for sub in value:
                    if sub not in own:
                        valid = ", ".join(sorted(own)) or "(none: this plugin declares no settings)"
                        raise ConfigError(
                            f"{self.where(sub, key)}: unknown key '[{key}] {sub}'{did_you_mean(sub, sorted(own))}; "
                            f"plugin '{key}' declares: {valid}"
                        )
                continue
            if key in core:
                continue
            if key in registry:
                owner = registry[key].owner
                raise ConfigError(
                    f"{self.where(key)}: key '{key}' belongs to plugin '{owner}'; put it in a [{owner}] table"
                )
            raise ConfigError(
                f"{self.where(key)}: unknown key '{key}'{did_you_mean(key, sorted(core))}; "
                f"valid top-level keys: {', '.join(sorted(core))}; plugin settings go in a [plugin] table"
            )


def is_accelerate_config(path: Path, text: str) -> bool:
    """An Accelerate config: YAML or JSON by its name, or a file whose first setting is written `key: value`."""
    if path.suffix.lower() in (".yaml", ".yml", ".json"):
        return True
    for line in text.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return bool(re.match(r"^[A-Za-z_][\w-]*\s*:(\s|$)", stripped)) or stripped.startswith("{")
    return False


def find_config_files(environ: Mapping[str, str], cwd: Path, config_file: str | None = None) -> list[ConfigFile]:
    """The config files of this run, highest priority first.

    `config_file` (from `--config-file` or `ACC_CONFIG_FILE`) replaces the project file `./acc.toml`.
    """
    files: list[ConfigFile] = []
    explicit = config_file or environ.get("ACC_CONFIG_FILE")
    if explicit:
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(f"config file {path} does not exist; give an existing file to --config-file (acc's TOML, "
                              "or an Accelerate YAML config)")
        files.append(ConfigFile.read(path, "config file"))
    elif (cwd / PROJECT_FILE).is_file():
        files.append(ConfigFile.read(cwd / PROJECT_FILE, "project file"))
    user = user_config_path(environ)
    if user.is_file():
        files.append(ConfigFile.read(user, "user file"))
    return files


def _toml_value(value: Any) -> str:
    import json

    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def dump(top: Mapping[str, Any], tables: Mapping[str, Mapping[str, Any]], header: str = "") -> str:
    """TOML text: kernel settings at the top level, each plugin's in its own table (None values left out)."""
    lines = [f"# {line}" for line in header.splitlines()] + ([""] if header else [])
    lines += [f"{key} = {_toml_value(value)}" for key, value in top.items() if value is not None]
    for table, values in tables.items():
        present = {k: v for k, v in values.items() if v is not None}
        if present:
            lines += ["", f"[{table}]"] + [f"{key} = {_toml_value(value)}" for key, value in present.items()]
    return "\n".join(lines) + "\n"


CONFIG_HEADER = "written by `acc config`; `acc config show` prints what it resolves to"
