"""The run manifest: what ran, how, with which software. Written by `acc launch` into the run directory
and into every checkpoint (there with the batch sizes the prepared loaders revealed). Secrets are not recorded:
the command line and the settings pass through `acc.assembly.redact` (credential-like names and token-shaped values).
Torch-free."""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Mapping

import importlib_metadata

RUN_DIR_ENV = "ACC_RUN_DIR"


def _version(dist: str) -> str | None:
    try:
        return importlib_metadata.version(dist)
    except importlib_metadata.PackageNotFoundError:
        return None


def software_versions(distributions: list[str]) -> dict[str, str]:
    """python, torch, acc-core, the given plugin distributions and what each of them requires."""
    names = ["torch", "acc-core", *distributions]
    for dist in distributions:
        try:
            reqs = importlib_metadata.requires(dist) or []
        except importlib_metadata.PackageNotFoundError:
            reqs = []
        for req in reqs:
            name = req.split(";")[0].split("[")[0]
            for sep in "<>=!~ (":
                name = name.split(sep)[0]
            if name and "extra ==" not in req:
                names.append(name.strip())
    versions = {"python": platform.python_version()}
    for name in dict.fromkeys(names):
        v = _version(name)
        if v:
            versions[name] = v
    return versions


def build(settings: Mapping[str, Any], sources: Mapping[str, str], plugins: Mapping[str, tuple[str, str]],
          command: list[str], world: Mapping[str, int] | None = None) -> dict[str, Any]:
    """The manifest as JSON-ready data. `plugins` maps plugin name to (distribution, version). The command line and
    the settings' values are redacted (`acc.assembly.redact`): a `--hf_token hf_...` script argument is not recorded."""
    from acc.assembly.redact import redact_argv, redact_data

    return {
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "command": redact_argv(command),
        "cwd": os.getcwd(),
        "host": platform.node(),
        "backend": settings["backend"],
        "plugins": _plugin_entries(plugins),
        "processes": dict(world or {"num_machines": settings["num_machines"], "nproc_per_machine": settings["nproc"],
                                    "world_size": settings["num_machines"] * settings["nproc"]}),
        "mixed_precision": settings["mixed_precision"],
        "gradient_accumulation_steps": settings["gradient_accumulation_steps"],
        "settings": {"values": redact_data(dict(settings)), "sources": dict(sources)},
        "versions": software_versions([d for d, _ in plugins.values() if d not in ("acc-core", "(module)")]),
    }


def run_directory(output_dir: str, backend: str, machine_rank: int) -> Path:
    """A new directory for this launch under `output_dir` (unique per launch and machine)."""
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = Path(output_dir) / f"{stamp}-{backend}-m{machine_rank}-{os.getpid()}"
    path, n = base, 1
    while True:  # one process may launch twice in a second (acc.launch from Python)
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            n += 1
            path = base.with_name(f"{base.name}-{n}")


def write_json(path: Path, data: Any) -> None:
    """Write JSON durably: to a side file, fsync, then rename over `path`."""
    import json

    tmp = path.with_name(path.name + ".part")
    with open(tmp, "w") as fp:
        json.dump(data, fp, indent=2, sort_keys=True)
        fp.flush()
        os.fsync(fp.fileno())
    os.replace(tmp, path)


def _plugin_entries(plugins: Mapping[str, tuple[str, str]]) -> dict[str, dict[str, str]]:
    """The manifest's `plugins`: plugin name -> its distribution and version."""
    return {name: {"distribution": d, "version": v} for name, (d, v) in plugins.items()}


def record_backend_switch(run_dir: str | None, backend: str, plugins: Mapping[str, tuple[str, str]],
                          launched: str, given: str) -> None:
    """Record in the run's manifest that the workers train on another backend than the launch chose (the script's
    code asked for it, as Accelerate's plugins do): `backend` and `plugins` become the ones that ran, and
    `backend_switch` keeps what the launch had and what chose the new one. Nothing without a run directory."""
    import json

    path = Path(run_dir) / "manifest.json" if run_dir else None
    if path is None or not path.is_file():
        return
    data = json.loads(path.read_text())
    data["backend_switch"] = {"launch": launched, "code": given}
    data["backend"] = backend
    data["plugins"] = _plugin_entries(plugins)
    write_json(path, data)


def launcher_command() -> list[str]:
    return [Path(sys.argv[0]).name, *sys.argv[1:]]
