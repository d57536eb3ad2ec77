"""`acc launch`: resolve settings, load the chosen plugins, ask the backend for a plan, run it.

The options a backend declares (`acc_add_settings`) become `acc launch` options once that backend is
chosen, so `acc launch --backend deepspeed --help` lists DeepSpeed's flags. To know which backend is
chosen before parsing, the raw arguments are peeked at for --backend, -p and --config-file.
"""

from __future__ import annotations

from typing import Any

import click

from ..assembly import Assembly, assemble
from ..launch.plan import ENGINES, LaunchPlan, Target
from ..settings import Setting

_PEEK = {"--backend": "backend", "-p": "plugins", "--plugin": "plugins", "--config-file": "config_file"}
_META_KEY = "acc.assembly"


def _value_flags() -> set[str]:
    """The kernel's flags that take a value (a backend's own flags are not known before it is loaded)."""
    from ..settings import core_settings

    return {flag for s in core_settings() if s.kind is not bool for flag in s.flags} | set(_PEEK)


def _peek(args: list[str]) -> dict[str, Any]:
    """--backend, -p and --config-file values given before the script (the rest is parsed by click)."""
    found: dict[str, Any] = {}
    takes_value = _value_flags()
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--" or not arg.startswith("-") or arg == "-":
            break
        name, eq, value = arg.partition("=")
        if name.startswith("-p") and not name.startswith("--") and len(name) > 2:
            name, value, eq = "-p", name[2:], "="
        if name in takes_value and not eq:
            value = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        if name in _PEEK:
            key = _PEEK[name]
            if key == "plugins":
                found.setdefault(key, []).append(value)
            else:
                found[key] = value
        i += 1
    return found


def _option_for(setting: Setting) -> click.Option:
    valid = setting.describe_valid()
    default = "" if setting.default in (None, [], "") else f"; default: {setting.default}"
    help_text = f"{setting.help} [{valid}{default}; env {setting.env_var}]"
    if setting.kind is bool:
        decls = [f"{flag}/--no-{flag.lstrip('-')}" for flag in setting.flags[:1]] + list(setting.flags[1:])
        return click.Option([*decls, setting.name], default=None, help=help_text)
    metavar = {int: "INT", float: "NUM", list: "NAME", str: "TEXT"}[setting.kind]
    if setting.choices:
        metavar = "[" + "|".join(setting.choices) + "]"
    return click.Option(
        [*setting.flags, setting.name], type=str, default=None, metavar=metavar,
        multiple=setting.kind is list, help=help_text,
    )


class LaunchCommand(click.Command):
    """A click command whose options include those of the plugins chosen in its own arguments."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        peeked = _peek(args)
        flags = {k: v for k, v in peeked.items() if k != "config_file"}
        assembly = assemble(flags=flags, config_file=peeked.get("config_file"), detect=True)
        ctx.meta[_META_KEY] = assembly
        ctx.meta[_META_KEY + ".params"] = [_option_for(s) for s in assembly.registry if s.flags]
        return super().parse_args(ctx, args)

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)  # includes --help, last
        extra = ctx.meta.get(_META_KEY + ".params", [])
        positional = [p for p in params if isinstance(p, click.Argument)]
        options = [p for p in params if not isinstance(p, click.Argument)]
        return options[:-1] + extra + options[-1:] + positional


LAUNCH_HELP = """Run SCRIPT (or -m MODULE) on the chosen backend.

\b
Settings come from, in order: flags > ACC_* environment variables > the project
file ./acc.toml (or --config-file) > the user file ~/.config/acc/config.toml > defaults.
A backend's own options are listed by: acc launch --backend NAME --help
"""


@click.command(
    "launch", cls=LaunchCommand, help=LAUNCH_HELP,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
)
@click.option("--dry-run", is_flag=True, help="Print the plan and the resolved settings; start nothing.")
@click.option("-m", "--module", "is_module", is_flag=True, help="SCRIPT is a module name, run as python -m.")
@click.option("--config-file", type=str, default=None, help="A TOML config file used instead of ./acc.toml.")
@click.argument("script", metavar="SCRIPT")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[ARGS]...")
@click.pass_context
def launch(ctx: click.Context, dry_run: bool, is_module: bool, config_file: str | None, script: str,
           script_args: tuple[str, ...], **setting_values: Any) -> None:
    from ..launch import orchestrate

    assembly = resolved_assembly(ctx, setting_values, config_file)
    target = Target(script, tuple(script_args), is_module)
    if assembly.detection_line and not dry_run:
        click.echo(f"acc: {assembly.detection_line}", err=True)
    plan = orchestrate.make_plan(assembly)
    orchestrate.check_target(target)
    if dry_run:
        click.echo(describe(assembly, plan, target))
        return
    env = orchestrate.worker_environment(assembly, plan)
    run_dir = orchestrate.record_run(assembly, plan, target)
    if run_dir is not None:
        env["ACC_RUN_DIR"] = str(run_dir.resolve())
    env.update(orchestrate.logging_environment(assembly, run_dir))
    code = orchestrate.execute(plan, target, env)
    from . import finish

    finish(code)


def resolved_assembly(ctx: click.Context, setting_values: dict[str, Any], config_file: str | None) -> Assembly:
    """The assembly with every parsed flag applied (a LaunchCommand's callback calls this first)."""
    assembly: Assembly = ctx.meta[_META_KEY]
    flags = {name: v for name, v in setting_values.items() if v is not None and v != ()}
    chosen = assembly.settings
    if assembly.detected or flags.get("backend", chosen["backend"]) != chosen["backend"] or \
            list(flags.get("plugins", chosen["plugins"])) != chosen["plugins"]:  # (detection weighs every flag)
        return assemble(flags=flags, config_file=config_file, detect=True)  # the peek missed a choice: start over
    return assembly.with_flags(flags)


def settings_lines(assembly: Assembly) -> list[str]:
    """Every setting with its value and where it came from, and the config files read."""
    s = assembly.settings
    lines = ["settings (value, then where it came from):"]
    name_width = max(len(n) for n in s)
    for name in s:
        value = s[name]
        shown = ",".join(value) if isinstance(value, list) else ("" if value is None else str(value))
        lines.append(f"  {name.ljust(name_width)}  {(shown or '-').ljust(12)}  {s.source(name)}")
    if assembly.files:
        lines.append("config files read: " + ", ".join(f"{f.path} ({f.label})" for f in assembly.files))
    return lines


def describe(assembly: Assembly, plan: LaunchPlan, target: Target) -> str:
    """The dry-run report: plan, plugins with versions, and every setting with its source."""
    s = assembly.settings
    lines = ["acc launch plan (dry run: nothing was started)"]
    if assembly.detection_line:
        lines.append(f"detected: {assembly.detection_line}")
    backend = s["backend"]
    info = assembly.infos.get(backend)
    plugin_rows = [
        f"{name} ({i.distribution} {i.version}{', default' if name == 'cpu' and backend != 'cpu' else ''})"
        for name, i in assembly.infos.items()
    ]
    rows = [
        ("backend", f"{backend} ({info.distribution} {info.version})" if info else backend),
        ("plugins", ", ".join(plugin_rows)),
        ("engine", f"{plan.engine}: {ENGINES[plan.engine]}"),
        ("processes", f"{plan.nproc_per_machine} per machine x {plan.num_machines} machine(s) = {plan.world_size}"
                      + (f", this is machine {plan.machine_rank}" if plan.num_machines > 1 else "")),
        ("device", plan.device),
        ("precision", s["mixed_precision"]),
        ("command", f"python {target}"),
    ]
    if plan.rendezvous is not None:
        rdzv = plan.rendezvous
        rows.append(("rendezvous", f"{rdzv.backend} at {rdzv.endpoint or 'a free local port (picked at start)'}"))
    if plan.max_restarts:
        rows.append(("restarts", str(plan.max_restarts)))
    if plan.engine == "elastic":
        method = s["start_method"]
        rows.append(("start", "spawn (fresh interpreters)" if method == "spawn" else
                     "fork from a launcher that imports torch once" + (" (auto: falls back to spawn, saying why, if "
                     "CUDA or threads were started in the launcher)" if method == "auto" else "")))
    width = max(len(k) for k, _ in rows)
    lines += [f"  {k.ljust(width)}  {v}" for k, v in rows]
    lines += settings_lines(assembly)
    from ..launch.orchestrate import environment_additions

    extra = environment_additions(plan)
    if extra:
        lines.append("worker environment additions: " + ", ".join(f"{k}={v}" for k, v in sorted(extra.items())))
    for note in plan.notes:
        lines.append(f"note: {note}")
    return "\n".join(lines)


