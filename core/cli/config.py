"""`acc config`: answer a few questions once (defaults from detection), then every `acc launch` uses them.

    acc config                 the questionnaire; writes the user file (or --project / --config-file PATH)
    acc config default         write what detection found, without questions
    acc config show            the resolved settings and where each comes from
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from ..assembly import assemble
from ..config import PROJECT_FILE, dump, user_config_path
from ..settings import Setting

CORE_QUESTIONS = ("nproc", "mixed_precision", "num_machines")
MULTI_MACHINE_QUESTIONS = ("machine_rank", "main_process_ip", "main_process_port")


def _target(config_file: Path | None, project: bool) -> Path:
    if config_file and project:
        raise click.UsageError("give either --config-file or --project, not both")
    return config_file or (Path(PROJECT_FILE) if project else user_config_path())


def _ask(setting: Setting, default: Any) -> Any:
    """Prompt for one setting; re-asks until the answer converts (messages say what is valid)."""

    def convert(raw: Any) -> Any:
        if raw in ("", None) and setting.default is None:
            return None
        try:
            return setting.convert(raw)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None

    if setting.kind is bool:
        return click.confirm(setting.help[:1].upper() + setting.help[1:], default=bool(default))
    shown = ",".join(default) if isinstance(default, list) else ("" if default is None else str(default))
    text = f"{setting.help[:1].upper() + setting.help[1:]} [{setting.describe_valid()}]"
    return click.prompt(text, default=shown, show_default=bool(shown), value_proc=convert)


def _write(path: Path, top: dict, tables: dict) -> None:
    if path.exists() and not click.confirm(f"{path} exists; replace it?", default=False):
        raise click.exceptions.Exit(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(top, tables, header="written by `acc config`; `acc config show` prints what it resolves to"))
    click.echo(f"wrote {path}")


@click.group("config", invoke_without_command=True)
@click.option("--config-file", type=click.Path(path_type=Path), default=None, help="Write this file instead.")
@click.option("--project", is_flag=True, help=f"Write the project file ./{PROJECT_FILE} instead of the user file.")
@click.pass_context
def config(ctx: click.Context, config_file: Path | None, project: bool) -> None:
    """Answer a few questions (defaults from this machine) and write the config file acc launch reads."""
    ctx.obj = _target(config_file, project)
    if ctx.invoked_subcommand is not None:
        return
    found = assemble(detect=True, config_file=None)
    from ..plugins import installed_backends

    installed = list(installed_backends())
    if found.detection_line:
        click.echo(f"detected: {found.detection_line}")
    backend = click.prompt("Backend", type=click.Choice(installed), default=found.settings["backend"])
    chosen = assemble(flags={"backend": backend})
    registry, top = chosen.registry, {"backend": backend}
    defaults = {"nproc": found.settings["nproc"] if backend == found.settings["backend"] else 1}
    for name in CORE_QUESTIONS:
        top[name] = _ask(registry[name], defaults.get(name, registry[name].default))
    if top["num_machines"] > 1:
        for name in MULTI_MACHINE_QUESTIONS:
            top[name] = _ask(registry[name], registry[name].default)
    tables: dict[str, dict] = {}
    for answer in chosen.pm.hook.acc_config_questions(settings=chosen.settings):
        for name in answer or []:
            setting = registry[name]
            tables.setdefault(setting.owner, {})[name] = _ask(setting, setting.default)
    flags = {**top, **{k: v for t in tables.values() for k, v in t.items()}}
    _validate(flags)
    _write(ctx.obj, top, tables)


def _validate(flags: dict) -> None:
    """Refuse to write settings the chosen backend would refuse at launch."""
    from ..launch import orchestrate

    raw = {k: (",".join(v) if isinstance(v, list) else str(v)) for k, v in flags.items() if v is not None}
    orchestrate.make_plan(assemble(flags=raw))  # an AccError is shown by the CLI, exit 2, nothing written


@config.command("default")
@click.pass_obj
def default(target: Path) -> None:
    """Write what detection found (backend and processes), without questions."""
    found = assemble(detect=True)
    click.echo(f"detected: {found.detection_line}")
    top: dict[str, Any] = {"backend": found.settings["backend"]}
    if found.settings["nproc"] != 1:
        top["nproc"] = found.settings["nproc"]
    _write(target, top, {})


@config.command("show")
@click.pass_context
def show(ctx: click.Context) -> None:
    """Print every resolved setting with its source (flag, env, project file, user file, detected, default)."""
    from .launch import settings_lines

    path = ctx.parent.params.get("config_file")
    found = assemble(detect=True, config_file=str(path) if path else None)
    if found.detection_line and found.settings.source("backend") == "detected":
        click.echo(f"detected: {found.detection_line}")
    click.echo("\n".join(settings_lines(found)))



