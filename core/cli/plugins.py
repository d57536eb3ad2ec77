"""`acc plugins`: installed backends and plugins, their versions, heavy dependencies and hooks. Torch-free."""

from __future__ import annotations

import json

import click

from ..errors import AccError
from ..plugins import (
    BUILTIN_BACKEND, PluginInfo, implemented_hooks, installed_backends, installed_plugins, module_available,
    plugin_requires,
)


def _describe(info: PluginInfo) -> dict:
    row: dict = {"name": info.name, "group": info.group, "distribution": info.distribution,
                 "version": info.version, "module": info.module}
    try:
        module = info.load_module()
    except AccError as exc:
        row["error"] = str(exc)
        return row
    row["requires"] = {name: module_available(name) for name in plugin_requires(module)}
    row["hooks"] = implemented_hooks(module)
    row["hookspec_version"] = getattr(module, "ACC_HOOKSPEC_VERSION", None)
    return row


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List installed backends (entry points 'acc.backends') and plugins ('acc.plugins')."""
    rows = [_describe(i) for i in installed_backends().values()] + [_describe(i) for i in installed_plugins().values()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for title, group in (("backends", "acc.backends"), ("plugins", "acc.plugins")):
            members = [r for r in rows if r["group"] == group]
            click.echo(f"{title} (entry-point group {group}):" + ("" if members else " none installed"))
            for r in members:
                tag = ", builtin default" if r["name"] == BUILTIN_BACKEND and group == "acc.backends" else ""
                click.echo(f"  {r['name']}  ({r['distribution']} {r['version']}{tag})")
                click.echo(f"    module    {r['module']}")
                if "error" in r:
                    click.echo(f"    ERROR     {r['error']}")
                    continue
                req = ", ".join(f"{m} ({'importable' if ok else 'NOT installed'})" for m, ok in r["requires"].items())
                click.echo(f"    requires  {req or '-'}")
                click.echo(f"    hooks     {', '.join(h[4:] for h in r['hooks'])}")
    broken = [r["name"] for r in rows if "error" in r]
    if broken:
        raise click.exceptions.Exit(1)
