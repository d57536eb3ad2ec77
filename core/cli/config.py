"""`acc config`: answer a few questions once (defaults from detection), then every `acc launch` uses them.

    acc config                 the questionnaire; writes the user file (or --project / --config-file PATH)
    acc config default         write what detection found, without questions
    acc config show            the resolved settings and where each comes from
    acc config import FILE     convert an Accelerate config (YAML, what `accelerate config` writes) to acc's TOML

Every subcommand takes the file options too (`acc config default --config-file PATH`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from acc.assembly.choose import assemble, detected_config
from acc.assembly.config_files import CONFIG_HEADER, PROJECT_FILE, dump, user_config_path
from acc.contract.settings import Setting

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


def _write(path: Path, top: dict, tables: dict, header: str | None = None) -> None:
    if path.exists() and not click.confirm(f"{path} exists; replace it?", default=False):
        raise click.exceptions.Exit(1)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dump(top, tables, header=CONFIG_HEADER if header is None else header))
    click.echo(f"wrote {path}")


def _file_options(read: bool = False) -> Any:
    """--config-file PATH / --project, on the group and on every subcommand (the subcommand's win)."""
    verb = "Read" if read else "Write"

    def decorate(fn: Any) -> Any:
        fn = click.option("--project", is_flag=True,
                          help=f"{verb} the project file ./{PROJECT_FILE} instead of the user file.")(fn)
        return click.option("--config-file", "--config_file", "config_file", type=click.Path(path_type=Path),
                            default=None, help=f"{verb} this file instead.")(fn)

    return decorate


def _chosen(ctx: click.Context, config_file: Path | None, project: bool) -> Path:
    """The file a subcommand works on: its own options, else the group's."""
    if config_file or project:
        return _target(config_file, project)
    return ctx.obj


@click.group("config", invoke_without_command=True)
@_file_options()
@click.pass_context
def config(ctx: click.Context, config_file: Path | None, project: bool) -> None:
    """Answer a few questions (defaults from this machine) and write the config file acc launch reads."""
    ctx.obj = _target(config_file, project)
    if ctx.invoked_subcommand is not None:
        return
    found = assemble(detect=True, config_file=None)
    from acc.assembly.plugins import installed_backends

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
    from acc.launcher import orchestrate

    raw = {k: (",".join(v) if isinstance(v, list) else str(v)) for k, v in flags.items() if v is not None}
    orchestrate.make_plan(assemble(flags=raw))  # an AccError is shown by the CLI, exit 2, nothing written


@config.command("default")
@_file_options()
@click.pass_context
def default(ctx: click.Context, config_file: Path | None, project: bool) -> None:
    """Write what detection found (backend and processes), without questions."""
    target = _chosen(ctx, config_file, project)
    top, line = detected_config()
    click.echo(f"detected: {line}")
    _write(target, top, {})


@config.command("show")
@_file_options(read=True)
@click.pass_context
def show(ctx: click.Context, config_file: Path | None, project: bool) -> None:
    """Print every resolved setting with its source (flag, env, project file, user file, detected, default)."""
    from acc.launcher.describe import settings_lines

    if config_file and project:
        raise click.UsageError("give either --config-file or --project, not both")
    path = config_file or ctx.parent.params.get("config_file")
    if project and not path and not Path(PROJECT_FILE).is_file():
        raise click.UsageError(f"there is no project file ./{PROJECT_FILE} here")
    found = assemble(detect=True, config_file=str(path) if path else None)
    if found.detection_line and found.settings.source("backend") == "detected":
        click.echo(f"detected: {found.detection_line}")
    click.echo("\n".join(settings_lines(found)))
    for cfg in found.files:
        for note in cfg.notes:
            click.echo(f"note: {note}")


@config.command("import")
@click.argument("source", type=click.Path(path_type=Path), metavar="FILE")
@_file_options()
@click.pass_context
def import_(ctx: click.Context, source: Path, config_file: Path | None, project: bool) -> None:
    """Convert an Accelerate config FILE (YAML, what `accelerate config` writes) into acc's TOML.

    \b
    Accelerate's keys are read with Accelerate's meaning (num_processes is the total over all
    machines); a key acc cannot honour is an error naming it. Writes the user file, or
    --project / --config-file PATH. Accelerate's own default config is
    ~/.cache/huggingface/accelerate/default_config.yaml.
    """
    from acc.assembly.config_files import ConfigFile
    from acc.errors import ConfigError

    target = _chosen(ctx, config_file, project)
    if not source.is_file():
        raise ConfigError(f"config file {source} does not exist; give the Accelerate config to convert "
                          "(`accelerate config` writes ~/.cache/huggingface/accelerate/default_config.yaml)")
    read = ConfigFile.read(source, "config file")
    if not read.accelerate:
        raise ConfigError(f"config file {source} is not an Accelerate config (YAML or JSON); an acc TOML file is read "
                          "as it is: acc launch --config-file FILE")
    assemble(config_file=str(source))  # refuse what acc launch would refuse (a bad value, a missing backend)
    for note in read.notes:
        click.echo(f"note: {note}")
    top = {k: v for k, v in read.data.items() if not isinstance(v, dict)}
    tables = {k: v for k, v in read.data.items() if isinstance(v, dict)}
    _write(target, top, tables, header=f"converted by `acc config import` from {source}")
