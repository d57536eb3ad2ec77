"""Assemble a run: config files + environment + flags -> the plugin set and the resolved settings.

The launcher and every worker assemble the same way, so each rank builds the same plugin manager. The
launcher hands its result to workers in one environment variable (`ACC_LAUNCH`, JSON), so a worker does
not re-read config files that might have changed; a script started without `acc launch` (plain
`python` or `torchrun`) assembles from its own environment and config files. Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pluggy

from acc.cluster import ClusterEnvironment, setting_values
from acc.cluster import check as check_cluster
from acc.config import ConfigFile, find_config_files
from acc.errors import ConfigError, PluginNotFoundError
from acc.plugins import PluginInfo, build_plugin_manager, collect_settings
from acc.settings import CORE_OWNER, ResolvedSettings, SettingsRegistry, core_settings, resolve

LAUNCH_ENV = "ACC_LAUNCH"


@dataclass
class Assembly:
    """The resolved settings with the plugin manager and the facts behind them."""

    settings: ResolvedSettings
    pm: pluggy.PluginManager
    infos: dict[str, PluginInfo]
    registry: SettingsRegistry
    files: list[ConfigFile] = field(default_factory=list)
    launched: bool = False  # True inside a worker started by `acc launch`
    detected: dict[str, Any] = field(default_factory=dict)  # what detection chose (backend, nproc)
    detection_line: str = ""  # the one line acc prints about it
    cluster: ClusterEnvironment | None = None  # the scheduler that started this launch (acc launch only)

    def with_flags(self, flags: Mapping[str, Any], environ: Mapping[str, str] | None = None) -> "Assembly":
        """The same plugin set with settings resolved again from `flags` (which must not change the set)."""
        _check_flags(flags, self.registry)
        settings = resolve(self.registry, flags, os.environ if environ is None else environ, self.files,
                           self.detected, setting_values(self.cluster))
        check_cluster(settings, self.cluster)
        return Assembly(settings, self.pm, self.infos, self.registry, self.files, self.launched, self.detected,
                        self.detection_line, self.cluster)


def _check_flags(flags: Mapping[str, Any], registry: SettingsRegistry) -> None:
    unknown = [name for name in flags if name not in registry]
    if unknown:
        raise ConfigError(f"unknown setting(s) {', '.join(unknown)}; known: {', '.join(registry.names())}")


def _core_registry() -> SettingsRegistry:
    registry = SettingsRegistry()
    for setting in core_settings():
        registry.add(setting, owner=CORE_OWNER)
    return registry


def assemble(
    flags: Mapping[str, Any] | None = None,
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    config_file: str | None = None,
    pm: pluggy.PluginManager | None = None,
    detect: bool = False,
    cluster: bool = False,
) -> Assembly:
    """Resolve settings (flag > ACC_* env > cluster > project/--config-file > user file > default), load plugins.

    With `detect` (acc launch, acc config), a backend nobody chose is picked by asking every installed backend
    how well it fits this machine (source "detected"). With `cluster` (acc launch), the cluster-environment
    plugins say whether a scheduler started this launch; its values are a source of their own, and a flag or
    variable that contradicts them is an error. With `pm` given (tests, embedding), that manager is used as is
    and no backend is loaded.
    """
    flags = dict(flags or {})
    environ = os.environ if environ is None else environ
    files = find_config_files(environ, cwd or Path.cwd(), config_file)
    detected: dict[str, Any] = {}
    line = ""
    found = _cluster(flags, environ, files) if cluster else None
    scheduler = setting_values(found)
    if pm is None:
        core = resolve(_core_registry(), flags, environ, files, cluster=scheduler)
        if detect and core.is_default("backend"):
            from acc.detection import detect as run_detection

            best, line = run_detection(core, environ)
            detected = {"backend": best.backend, "nproc": best.nproc}
            core = resolve(_core_registry(), flags, environ, files, detected, scheduler)
        try:
            pm, infos = build_plugin_manager(core["backend"], core["plugins"])
        except PluginNotFoundError as exc:  # say where the backend or plugin that is not there was asked for
            where = core.source(exc.setting)
            raise PluginNotFoundError(f"{exc} ({exc.setting} from {where})" if where != "default" else str(exc),
                                      exc.setting) from None
    else:
        infos = {}
    registry = collect_settings(pm)
    loaded = {name for name, _ in pm.list_name_plugin()}
    for cfg in files:
        cfg.check_keys(registry, loaded)
    _check_flags(flags, registry)
    settings = resolve(registry, flags, environ, files, detected, scheduler)
    check_cluster(settings, found)
    return Assembly(settings, pm, infos, registry, files, detected=detected, detection_line=line, cluster=found)


def _cluster(flags: Mapping[str, Any], environ: Mapping[str, str], files: list[ConfigFile]
             ) -> ClusterEnvironment | None:
    """The active cluster environment (plugins blocked with -p no:NAME are not asked)."""
    from acc.cluster import detect as detect_cluster
    from acc.plugins import split_plugin_specs

    plugins = resolve(_core_registry(), flags, environ, files)["plugins"]
    return detect_cluster(environ, blocked=split_plugin_specs(plugins)[1])


def assemble_worker(
    environ: Mapping[str, str] | None = None, pm: pluggy.PluginManager | None = None
) -> Assembly:
    """The assembly inside a training process: from `ACC_LAUNCH` when launched by acc, else from scratch."""
    environ = os.environ if environ is None else environ
    blob = environ.get(LAUNCH_ENV)
    if not blob:
        return assemble(environ=environ, pm=pm)
    try:
        settings = ResolvedSettings.from_json(blob)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"environment variable {LAUNCH_ENV} is not what acc launch writes ({exc}); unset it") from None
    if pm is None:
        pm, infos = build_plugin_manager(settings["backend"], settings["plugins"])
    else:
        infos = {}
    return Assembly(settings, pm, infos, collect_settings(pm), launched=True)
