"""`acc plugins`: installed backends and plugins, their versions, heavy dependencies and hooks. Torch-free."""

from __future__ import annotations

import json

import click

from acc.assembly.plugins import (
    BUILTIN_BACKEND,
    PluginInfo,
    implemented_hooks,
    installed_backends,
    installed_plugins,
    module_available,
    plugin_requires,
)
from acc.errors import AccError


def _describe(info: PluginInfo) -> dict:
    row: dict = {"name": info.name, "group": info.group, "distribution": info.distribution,
                 "version": info.version, "module": info.module}
    try:
        module = info.load_module()
    except AccError as exc:
        row["error"] = str(exc)
        return row
    from acc.contract.hookspecs import HOOKSPEC_VERSION, SUPPORTED_VERSIONS

    row["requires"] = {name: module_available(name) for name in plugin_requires(module)}
    row["hooks"] = implemented_hooks(module)
    version = getattr(module, "ACC_HOOKSPEC_VERSION", None)
    row["hookspec_version"] = version
    if version is None:
        row["error"] = f"declares no ACC_HOOKSPEC_VERSION: add `ACC_HOOKSPEC_VERSION = {HOOKSPEC_VERSION}` to {info.module}"
    elif version not in SUPPORTED_VERSIONS:
        row["error"] = (f"targets hook-spec version {version!r}; this acc-core provides "
                        f"{', '.join(map(str, SUPPORTED_VERSIONS))}: install a release of {info.distribution} built "
                        "for this acc-core")
    elif version < HOOKSPEC_VERSION:
        row["warning"] = (f"targets hook-spec version {version}, deprecated (still loaded through acc 0.x): port it to "
                          f"version {HOOKSPEC_VERSION} (docs/guides/writing-a-backend.md)")
    return row


def _describe_tracker(info: PluginInfo) -> dict:
    from acc.tracking import load_tracker_class

    row: dict = {"name": info.name, "group": info.group, "distribution": info.distribution,
                 "version": info.version, "module": info.module}
    try:
        cls = load_tracker_class(info)  # the plugin's module; its library is imported only when it runs
    except AccError as exc:
        row["error"] = str(exc)
        return row
    row["requires"] = {name: module_available(name) for name in plugin_requires(cls)}
    row["main_process_only"] = bool(getattr(cls, "main_process_only", True))
    row["requires_logging_directory"] = bool(cls.requires_logging_directory)
    row["accepts_logging_directory"] = bool(getattr(cls, "accepts_logging_directory", False))
    return row


def _mark_active(rows: list[dict]) -> None:
    """Say, on each cluster environment's row, whether its scheduler started this shell (and as what)."""
    import os

    from acc.assembly.clusters import cluster_manager, detect

    names = [r["name"] for r in rows if "error" not in r]
    try:
        found = detect(os.environ, pm=cluster_manager(blocked=[r["name"] for r in rows if "error" in r]))
    except AccError as exc:
        for r in rows:
            r.setdefault("active", f"cannot tell: {exc}")
        return
    for r in rows:
        if r["name"] not in names:
            continue
        if found is not None and found.name == r["name"]:
            r["active"] = f"yes: {found.label}"
        elif found is not None and any(a.startswith(r["name"] + " ") for a in found.also_active):
            r["active"] = f"yes, but not used: {found.name} is more specific"
        else:
            r["active"] = "no"


@click.command("plugins")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
def plugins(as_json: bool) -> None:
    """List installed backends (entry points 'acc.backends'), plugins ('acc.plugins'), cluster environments
    ('acc.clusters') and trackers ('acc.trackers')."""
    from acc.assembly.clusters import CLUSTER_GROUP, installed_clusters
    from acc.tracking import BUILTIN_TRACKER, TRACKER_GROUP, installed_trackers

    rows = [_describe(i) for i in installed_backends().values()] + [_describe(i) for i in installed_plugins().values()]
    clusters = [_describe(i) for i in installed_clusters().values()]
    _mark_active(clusters)
    rows += clusters
    trackers = [_describe_tracker(i) for i in installed_trackers().values()]
    rows += trackers
    if as_json:
        click.echo(json.dumps(rows, indent=2))
    else:
        for title, group in (("backends", "acc.backends"), ("plugins", "acc.plugins"),
                             ("cluster environments", CLUSTER_GROUP)):
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
                click.echo(f"    contract  hook-spec version {r['hookspec_version']}")
                if "warning" in r:
                    click.echo(f"    WARNING   {r['warning']}")
                click.echo(f"    hooks     {', '.join(h[4:] for h in r['hooks'])}")
                if "active" in r:
                    click.echo(f"    active    {r['active']}")
        click.echo(f"trackers (entry-point group {TRACKER_GROUP}; choose with log_with=NAME, --log-with NAME or all):")
        for r in trackers:
            tag = ", builtin" if r["name"] == BUILTIN_TRACKER else ""
            click.echo(f"  {r['name']}  ({r['distribution']} {r['version']}{tag})")
            click.echo(f"    class     {r['module']}")
            if "error" in r:
                click.echo(f"    ERROR     {r['error']}")
                continue
            req = ", ".join(f"{m} ({'importable' if ok else 'NOT installed'})" for m, ok in r["requires"].items())
            click.echo(f"    requires  {req or '-'}")
            ranks = "the main process" if r["main_process_only"] else "every process"
            where = ("under the logging directory (project_dir)" if r["requires_logging_directory"] else
                     "under the logging directory when there is one" if r["accepts_logging_directory"] else
                     "where its library and init_kwargs say")
            click.echo(f"    logs      on {ranks}, {where}")
    broken = [r["name"] for r in rows if "error" in r]
    if broken:
        raise click.exceptions.Exit(1)
