"""How a run is put together: which backend and plugins it loads and what every setting is. Read this first.

`assemble()` is the one place a backend is chosen, in this order:

1. the sources of the `backend` setting, highest first: a flag (`--backend`), the environment (`ACC_BACKEND`),
   the active cluster environment (`acc.assembly.clusters`; a scheduler names machines and ranks, not backends),
   the project file (`./acc.toml` or `--config-file`), the user file (`~/.config/acc/config.toml`);
2. when none of them set it and the caller asks for detection (`acc launch`, `acc config`): every installed
   backend answers `acc_detect` and the best fit wins (`acc.assembly.detection`);
3. otherwise the default, the builtin `cpu` backend.

Then `acc.assembly.plugins.build_plugin_manager` loads the chosen backend (entry-point group `acc.backends`) and
the `-p` plugins, registers the builtin cpu backend `trylast` (it answers every selection hook nobody else
answers), and checks that no two plugins answer one selection hook. The plugins' own settings join the kernel's
(`acc_add_settings`), config-file keys are checked against them, and every setting is resolved with its source
(`acc.assembly.settings.resolve`). The launcher hands the result to its workers (`acc.assembly.handoff`). Torch-free.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import pluggy

from acc.assembly.clusters import ClusterEnvironment, setting_values
from acc.assembly.clusters import check as check_cluster
from acc.assembly.config_files import ConfigFile, find_config_files
from acc.assembly.plugins import PluginInfo, build_plugin_manager, collect_settings
from acc.assembly.settings import core_settings, resolve
from acc.contract.settings import CORE_OWNER, ResolvedSettings, SettingsRegistry
from acc.errors import ConfigError, PluginNotFoundError


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

    def plugin_versions(self) -> dict[str, tuple[str, str]]:
        """Each plugin's (distribution, version), as the manifests record them."""
        return {name: (info.distribution, info.version) for name, info in self.infos.items()}

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
            from acc.assembly.detection import detect as run_detection

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
    from acc.assembly.clusters import detect as detect_cluster
    from acc.assembly.plugins import split_plugin_specs

    plugins = resolve(_core_registry(), flags, environ, files)["plugins"]
    return detect_cluster(environ, blocked=split_plugin_specs(plugins)[1])


def detected_config() -> tuple[dict[str, Any], str]:
    """What `acc config default` writes: the backend and processes per machine detection finds on this machine
    (the top-level keys of the file), and the one line that says why."""
    found = assemble(detect=True)
    top: dict[str, Any] = {"backend": found.settings["backend"]}
    if found.settings["nproc"] != 1:
        top["nproc"] = found.settings["nproc"]
    return top, found.detection_line
