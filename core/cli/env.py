"""`acc env`: versions and hardware for bug reports (imports torch and each plugin's library)."""

from __future__ import annotations

import os
import platform
import sys

import click

from .._version import __version__
from ..errors import AccError
from ..hardware import visible_cuda_devices
from ..plugins import installed_backends, installed_plugins


@click.command("env")
def env() -> None:
    """Print versions (python, torch, acc, plugins) and hardware facts for a bug report."""
    from ..assembly import assemble

    settings = assemble().settings
    click.echo("acc env (paste this into bug reports)")
    rows = [
        ("acc-core", __version__),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}) at {sys.executable}"),
        ("platform", platform.platform()),
        ("cpus", str(os.cpu_count())),
        ("cuda devices (driver)", str(visible_cuda_devices())),
    ]
    for k, v in rows:
        click.echo(f"  {k:22} {v}")
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
            click.echo(f"  {k:22} {v}")
