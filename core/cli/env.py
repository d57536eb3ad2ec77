"""`acc env`: versions and hardware for bug reports (imports torch and each plugin's library).

It carries what `accelerate env` prints (platform, python, numpy, torch and its accelerator, RAM, the tool's
version, location and config), so its output can be pasted where that was asked for.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

import click

from acc.assembly.hardware import visible_cuda_devices
from acc.assembly.plugins import installed_backends, installed_plugins
from acc.assembly.redact import redact_value
from acc.contract.version import __version__
from acc.errors import AccError


def _ram() -> str:
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return "unknown"
    return f"{total / 1024 ** 3:.2f} GB"


def _numpy() -> str:
    try:
        import numpy
    except ImportError:
        return "not installed"
    return numpy.__version__


def _torch() -> list[tuple[str, str]]:
    """torch's version, the accelerator it sees (as `accelerate env` names it) and that device's name."""
    try:
        import torch
    except ImportError:
        return [("torch", "not installed"), ("torch accelerator", "N/A")]
    rows = [("torch", torch.__version__)]
    if torch.cuda.is_available():
        rows += [("torch accelerator", "CUDA"), ("GPU type", torch.cuda.get_device_name())]
    elif getattr(torch, "xpu", None) is not None and torch.xpu.is_available():
        rows += [("torch accelerator", "XPU"), ("XPU type", torch.xpu.get_device_name())]
    elif torch.backends.mps.is_available():
        rows.append(("torch accelerator", "MPS"))
    else:
        rows.append(("torch accelerator", "N/A"))
    return rows


@click.command("env")
@click.option("--config-file", "--config_file", "config_file", type=click.Path(path_type=Path), default=None,
              help="Report this config file (acc's TOML or an Accelerate YAML) instead of ./acc.toml.")
def env(config_file: Path | None) -> None:
    """Print versions (python, numpy, torch, acc, plugins), hardware and the config, for a bug report."""
    from acc.assembly.choose import assemble

    found = assemble(config_file=str(config_file) if config_file else None)
    settings = found.settings
    click.echo("acc env (paste this into bug reports; it has what `accelerate env` prints)")
    rows = [
        ("acc-core", __version__),
        ("acc location", shutil.which("acc") or sys.argv[0]),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}) at {sys.executable}"),
        ("platform", platform.platform()),
        ("numpy", _numpy()),
        *_torch(),
        ("system RAM", _ram()),
        ("cpus", str(os.cpu_count())),
        ("cuda devices (driver)", str(visible_cuda_devices())),
    ]
    for k, v in rows:
        click.echo(f"  {k:22} {v}")
    click.echo("config")
    files = ", ".join(f"{f.path} ({f.label})" for f in found.files)
    click.echo(f"  {'files':22} {files or 'none found (settings from flags, ACC_* variables and defaults)'}")
    for name in settings:
        if not settings.is_default(name):
            value = redact_value(name, settings[name])  # a credential-like setting is not shown
            shown = ",".join(value) if isinstance(value, list) else str(value)
            click.echo(f"  {name:22} {shown}  ({settings.source(name)})")
    for info in [*installed_backends().values(), *installed_plugins().values()]:
        click.echo(f"{info.name} ({info.distribution} {info.version})")
        try:
            module = info.load_module()
            report_fn = getattr(module, "acc_env_report", None)
            report = report_fn(settings=settings) if report_fn else None
        except AccError as exc:
            click.echo(f"  error: {exc}")
            continue
        except Exception as exc:  # a plugin's report failing is itself a fact worth reporting
            click.echo(f"  error while reporting: {type(exc).__name__}: {exc}")
            continue
        for k, v in (report or {}).items():
            click.echo(f"  {k:22} {redact_value(str(k), v)}")
