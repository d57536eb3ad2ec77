"""The hand-off from the launcher to its workers: one environment variable, `ACC_LAUNCH`.

```
acc launch (launcher process)                         each worker process
  acc.assembly.choose.assemble()  -> settings            Accelerator() / PartialState()
  acc.launcher.orchestrate         -> write(env, ...)      -> acc.runtime.worker.worker.Runtime
       env["ACC_LAUNCH"] = settings + sources as JSON        -> assemble_worker(): read(environ),
  the engine (elastic agent, fork, exec, PJRT) starts            the same plugin set rebuilt from
  the workers with that environment                              settings["backend"], settings["plugins"]
```

A worker does not re-read config files that may have changed since the launch; every rank builds the same plugin
manager from the same settings. A script started without `acc launch` (plain `python`, `torchrun`) has no
`ACC_LAUNCH` and assembles from its own environment and config files. Torch-free.
"""

from __future__ import annotations

import os
from typing import Mapping, MutableMapping

import pluggy

from acc.assembly.choose import Assembly, assemble
from acc.assembly.plugins import build_plugin_manager, collect_settings
from acc.assembly.settings import resolve
from acc.contract.settings import ResolvedSettings, apply_presets
from acc.errors import ConfigError

LAUNCH_ENV = "ACC_LAUNCH"


def write(env: MutableMapping[str, str], settings: ResolvedSettings) -> None:
    """Put the launch's resolved settings (values and sources) into a worker environment."""
    env[LAUNCH_ENV] = settings.to_json()


def read(environ: Mapping[str, str]) -> ResolvedSettings | None:
    """The settings `acc launch` handed to this process, or None when it was not started by `acc launch`."""
    blob = environ.get(LAUNCH_ENV)
    if not blob:
        return None
    try:
        return ResolvedSettings.from_json(blob)
    except (ValueError, KeyError, TypeError) as exc:
        raise ConfigError(f"environment variable {LAUNCH_ENV} is not what acc launch writes ({exc}); unset it") from None


def assemble_worker(
    environ: Mapping[str, str] | None = None, pm: pluggy.PluginManager | None = None
) -> Assembly:
    """The assembly inside a training process: from `ACC_LAUNCH` when launched by acc, else from scratch."""
    environ = os.environ if environ is None else environ
    settings = read(environ)
    if settings is None:
        return assemble(environ=environ, pm=pm)
    if pm is None:
        pm, infos = build_plugin_manager(settings["backend"], settings["plugins"])
    else:
        infos = {}
    return Assembly(settings, pm, infos, collect_settings(pm), launched=True)


def with_backend(assembly: Assembly, backend: str, source: str,
                 environ: Mapping[str, str] | None = None) -> Assembly:
    """The same run on another backend (a worker whose script's code chose one, as Accelerate's plugins do):
    its plugin set rebuilt with `backend`, every setting kept, and the new backend's own settings resolved from
    the environment (ACC_*) and their defaults. Raises PluginNotFoundError when `backend` is not installed."""
    settings = assembly.settings
    pm, infos = build_plugin_manager(backend, settings["plugins"])
    registry = collect_settings(pm)
    fresh = resolve(registry, {}, os.environ if environ is None else environ)
    values, sources = dict(fresh.values), dict(fresh.sources)
    for name in registry.names():
        if name in settings:
            values[name], sources[name] = settings[name], settings.source(name)
    values["backend"], sources["backend"] = backend, source
    apply_presets(registry, values, sources)
    return Assembly(ResolvedSettings(values, sources), pm, infos, registry, assembly.files, assembly.launched,
                    assembly.detected, assembly.detection_line, assembly.cluster)
