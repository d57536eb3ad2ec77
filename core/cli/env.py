"""`acc env`: versions and hardware for bug reports (imports torch and each plugin's library when it runs).

It carries what `accelerate env` prints (platform, python, numpy, torch and its accelerator, RAM, the tool's
version, location and config), so its output can be pasted where that was asked for. The figures and the plugins'
reports come from `acc.runtime.environment_report`, which Accelerate's `env_command` (`acc.commands.env`) prints too.
"""

from __future__ import annotations

import os
import platform
import shutil
import sys
from pathlib import Path

import click

from acc.assembly.hardware import visible_cuda_devices
from acc.compat.dropin import describe as describe_accelerate
from acc.contract.version import __version__


@click.command("env")
@click.option("--config-file", "--config_file", "config_file", type=click.Path(path_type=Path), default=None,
              help="Report this config file (acc's TOML or an Accelerate YAML) instead of ./acc.toml.")
def env(config_file: Path | None) -> None:
    """Print versions (python, numpy, torch, acc, plugins), hardware and the config, for a bug report."""
    from acc.assembly.choose import assemble
    from acc.runtime import environment_report as report

    found = assemble(config_file=str(config_file) if config_file else None)
    click.echo("acc env (paste this into bug reports; it has what `accelerate env` prints)")
    rows = [
        ("acc-core", __version__),
        ("acc location", shutil.which("acc") or sys.argv[0]),
        ("import accelerate", describe_accelerate()),
        ("python", f"{platform.python_version()} ({platform.python_implementation()}) at {sys.executable}"),
        ("platform", platform.platform()),
        ("numpy", report.numpy_version()),
        *report.torch_rows(),
        ("system RAM", report.system_ram()),
        ("cpus", str(os.cpu_count())),
        ("cuda devices (driver)", str(visible_cuda_devices())),
    ]
    for k, v in rows:
        click.echo(f"  {k:22} {v}")
    click.echo("config")
    for k, v in report.config_rows(found):
        click.echo(f"  {k:22} {v}")
    for plugin in report.plugin_reports(found.settings):
        click.echo(f"{plugin.name} ({plugin.distribution} {plugin.version})")
        if plugin.error is not None:
            click.echo(f"  {plugin.error}")
        for k, v in plugin.rows.items():
            click.echo(f"  {k:22} {v}")
