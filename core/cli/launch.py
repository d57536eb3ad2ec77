"""`acc launch`: resolve settings, load the chosen plugins, ask the backend for a plan, run it.

The options a backend declares (`acc_add_settings`) become `acc launch` options once that backend is
chosen, so `acc launch --backend deepspeed --help` lists DeepSpeed's flags. To know which backend is
chosen before parsing, the raw arguments are peeked at for --backend, -p and --config-file.

`accelerate launch`'s options are read too, with Accelerate's meaning (`acc.compat.accelerate_launch` turns them into
acc's flags first; the dry run names the spelling that was typed as each setting's source).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable

import click

from acc.assembly.choose import Assembly, assemble
from acc.contract.launch_plan import Target
from acc.contract.settings import Setting, SettingsRegistry
from acc.errors import ConfigError, LaunchError, PluginNotFoundError

if TYPE_CHECKING:
    from acc.compat.accelerate_launch import LaunchTranslation

_PEEK = {"--backend": "backend", "-p": "plugins", "--plugin": "plugins", "--config-file": "config_file"}
_META_KEY = "acc.assembly.choose"
_TRANSLATION_KEY = "acc.accelerate"
_OWN_OPTIONS = ("--dry-run", "-m", "--module", "--no-python", "--config-file", "-h", "--help")


def _value_flags(settings: Iterable[Setting] | None = None) -> set[str]:
    """The flags that take a value: the kernel's, or those of `settings` (a loaded plugin set's registry)."""
    from acc.assembly.settings import core_settings

    return {flag for s in (core_settings() if settings is None else settings) if s.kind is not bool
            for flag in s.flags} | set(_PEEK)


def _known_options(settings: Iterable[Setting] | None = None) -> set[str]:
    """Every option of `acc launch` (bools with their --no- form), for the kernel or a loaded plugin set."""
    from acc.assembly.settings import core_settings

    known = set(_OWN_OPTIONS)
    for s in core_settings() if settings is None else settings:
        known.update(s.flags)
        if s.kind is bool and s.flags:
            known.add("--no-" + s.flags[0].lstrip("-"))
    return known


def _peek(args: list[str], takes_value: set[str] | None = None) -> dict[str, Any]:
    """--backend, -p and --config-file values given before the script (the rest is parsed by click)."""
    found: dict[str, Any] = {}
    from acc.compat.accelerate_launch import EMITTED_VALUE_FLAGS

    takes_value = (_value_flags() if takes_value is None else takes_value) | EMITTED_VALUE_FLAGS
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
        return click.Option([*decls, setting.param], default=None, help=help_text)
    metavar = {int: "INT", float: "NUM", list: "NAME", str: "TEXT"}[setting.kind]
    if setting.choices:
        metavar = "[" + "|".join(setting.choices) + "]"
    return click.Option(
        [*setting.flags, setting.param], type=str, default=None, metavar=metavar,
        multiple=setting.kind is list, help=help_text,
    )


class LaunchCommand(click.Command):
    """A click command whose options include those of the plugins chosen in its own arguments."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        from acc.compat import accelerate_launch
        from acc.compat.accelerate_launch import translate_launch_args

        value_flags = _value_flags()
        translation = translate_launch_args(args, value_flags, _known_options())
        assembly = _assemble(translation, value_flags)
        # again, now that the chosen backend's own flags are known (their underscore spellings, their values)
        registry_flags = _value_flags(assembly.registry)
        known = _known_options(assembly.registry)
        second = translate_launch_args(args, registry_flags, known)
        if _peek(second.args, registry_flags) != _peek(translation.args, value_flags):
            assembly = _assemble(second, registry_flags)
        else:
            second.nproc = translation.nproc
        translation = second
        for option, owner in translation.owners.items():
            if option not in known:
                raise ConfigError(f"flag {translation.typed[option]} sets the {owner} backend's "
                                  f"{option[2:].replace('-', '_')}, but the backend is {assembly.settings['backend']}; "
                                  f"choose it with {accelerate_launch.backend_hint(owner)}")
        args = translation.args
        if translation.nproc is not None:
            args = args[:translation.n_options] + ["--nproc", str(translation.nproc[0])] + \
                args[translation.n_options:]
        ctx.meta[_META_KEY] = assembly
        ctx.meta[_TRANSLATION_KEY] = translation
        ctx.meta[_META_KEY + ".params"] = [_option_for(s) for s in assembly.registry if s.flags]
        try:
            return super().parse_args(ctx, args)
        except click.NoSuchOption as exc:
            owner = _backend_owning(exc.option_name, assembly.settings["backend"])
            if owner is None:
                raise
            raise ConfigError(f"flag {exc.option_name} is a setting of the {owner} backend, but the backend is "
                              f"{assembly.settings['backend']} ({assembly.settings.source('backend')}); "
                              f"choose it with --backend {owner}") from None

    def get_params(self, ctx: click.Context) -> list[click.Parameter]:
        params = super().get_params(ctx)  # includes --help, last
        extra = ctx.meta.get(_META_KEY + ".params", [])
        positional = [p for p in params if isinstance(p, click.Argument)]
        options = [p for p in params if not isinstance(p, click.Argument)]
        return options[:-1] + extra + options[-1:] + positional


def _backend_owning(flag: str, current: str) -> str | None:
    """The installed backend (other than `current`) whose settings include `flag`, if any (asked only when a
    flag is unknown: each backend's launcher side is loaded, torch-free)."""
    from acc.assembly.plugins import installed_backends

    for name in installed_backends():
        if name == current:
            continue
        try:
            registry = assemble(flags={"backend": name}).registry
        except Exception:  # noqa: BLE001 - a backend that cannot load owns nothing here
            continue
        if any(flag in s.flags or flag == "--no-" + s.flags[0].lstrip("-") for s in registry if s.flags):
            return name
    return None


def _assemble(translation: LaunchTranslation, value_flags: set[str]) -> Assembly:
    """The assembly the translated arguments choose (backend, plugins, config file, processes)."""
    peeked = _peek(translation.args, value_flags)
    flags = {k: v for k, v in peeked.items() if k != "config_file"}
    translation.nproc = _processes(translation, peeked.get("config_file"), flags)
    if translation.nproc is not None:
        flags["nproc"] = str(translation.nproc[0])
    try:
        return assemble(flags=flags, config_file=peeked.get("config_file"), detect=True, cluster=True)
    except PluginNotFoundError as exc:
        typed = translation.typed.get("--backend", "--backend")
        raise PluginNotFoundError(str(exc).replace("(backend from flag --backend)", f"(backend from flag {typed})"),
                                  exc.setting) from None


def _processes(translation: LaunchTranslation, config_file: str | None, peeked: dict[str, Any]
               ) -> tuple[int, str] | None:
    """(processes per machine, source) where Accelerate's meaning decides them, else None:

    --num_processes N (or an Accelerate config's num_processes, when num_machines comes from elsewhere) is the
    total over all machines; --multi_gpu/--use_fsdp/--use_deepspeed without a process count run one process
    per visible GPU, as `accelerate launch` does.
    """
    from acc.assembly.choose import _cluster, _core_registry
    from acc.assembly.clusters import setting_values
    from acc.assembly.config_files import find_config_files
    from acc.assembly.settings import resolve
    from acc.compat import accelerate_launch

    registry = _core_registry()
    flags: dict[str, Any] = {}
    raw = translation.values.get("--num-machines")
    if raw is not None:
        flags["num_machines"] = _converted(registry["num_machines"], raw, translation.typed.get("--num-machines"))
    files = find_config_files(os.environ, Path.cwd(), config_file)
    scheduler = setting_values(_cluster(peeked, os.environ, files))  # the scheduler's machine count counts too
    core = resolve(registry, flags, os.environ, files, cluster=scheduler)
    machines = core["num_machines"]
    source = core.source("num_machines")
    if raw is not None:
        source = f"flag {translation.typed['--num-machines']}"
    if translation.total_processes is not None:
        total, flag = translation.total_processes, translation.total_flag
        per = accelerate_launch.per_machine(total, machines, f"flag {flag}", source)
        return per, f"flag {flag}" + (f" ({total} over {machines} machines)" if machines > 1 else "")
    if "--nproc" in translation.values or "ACC_NPROC" in os.environ or "nproc" in scheduler:
        return None
    nproc_setting = registry["nproc"]
    first = next((f for f in files if f.lookup(nproc_setting)[0]), None)
    if first is not None:
        where = f"{first.label} {first.path}"
        if first.total_processes is None or machines == first.total_machines:
            return None  # the file's own num_processes / num_machines (or an acc file's nproc) hold
        per = accelerate_launch.per_machine(first.total_processes, machines, f"{first.where('nproc')}: key "
                                            "'num_processes'", source)
        return per, f"{where} (num_processes {first.total_processes} over {machines} machines)"
    backend = translation.values.get("--backend")
    cpu = core["cpu"] or ("--cpu" in translation.typed and "--no-cpu" not in translation.typed)
    if translation.backend_flag and backend in ("ddp", "fsdp", "deepspeed") and machines == 1 and not cpu:
        from acc.assembly.hardware import visible_cuda_devices

        cuda = visible_cuda_devices()
        if cuda:
            return cuda, f"detected ({translation.backend_flag} without --num_processes: one process per visible GPU)"
    return None


def _converted(setting: Setting, raw: Any, typed: str | None) -> Any:
    """`raw` converted, or a ConfigError naming the flag as the user typed it."""
    try:
        return setting.convert(raw)
    except ValueError as exc:
        raise ConfigError(f"flag {typed or setting.flags[0]}: {exc} ({setting.name}: {setting.help})") from None


def _typed(setting: Setting, translation: LaunchTranslation | None) -> str | None:
    """The spelling the user typed for `setting` (e.g. --mixed_precision for --mixed-precision)."""
    if translation is None:
        return None
    forms = list(setting.flags) + (["--no-" + setting.flags[0].lstrip("-")] if setting.kind is bool and setting.flags
                                   else [])
    return next((translation.typed[f] for f in forms if f in translation.typed), None)


ACCELERATE_HELP = """\b
Accelerate's spellings (underscores or dashes) work with Accelerate's meaning:
  --num_processes N (total over all machines: --nproc = N / --num_machines),
  --multi_gpu | --use_fsdp | --use_deepspeed | --tpu (the backend: ddp, fsdp,
  deepspeed, xla), --mixed_precision, --gradient_accumulation_steps, --cpu,
  --num_machines, --machine_rank, --main_process_ip, --main_process_port,
  --rdzv_backend, --max_restarts, --monitor_interval, --log_dir, --tee [0|3],
  --module, --no_python, --config_file (acc TOML or Accelerate YAML),
  --zero_stage, --deepspeed_config_file, --offload_optimizer_device,
  --offload_param_device, --gradient_clipping, --fsdp_sharding_strategy,
  --fsdp_reshard_after_forward, --fsdp_offload_params, --fsdp_auto_wrap_policy,
  --fsdp_transformer_layer_cls_to_wrap, --fsdp_min_num_params, --fsdp_version.
  Accepted, no effect: --same_network (acc's machines always meet at
  --main_process_ip:--main_process_port, on one network or not), --quiet (the
  failure report is short anyway), and values that ask for what acc does
  anyway (--dynamo_backend no, --gpu_ids all, --zero3_init_flag false, ...).
  Any other Accelerate option is an error that says what acc offers instead.
"""


LAUNCH_HELP = """Run SCRIPT (or -m MODULE) on the chosen backend.

\b
Settings come from, in order: flags > ACC_* environment variables > the cluster
that started this launch (SLURM, Kubeflow, LSF, mpirun: see acc plugins) > the project
file ./acc.toml (or --config-file) > the user file ~/.config/acc/config.toml > defaults.
A backend's own options are listed by: acc launch --backend NAME --help
"""


@click.command(
    "launch", cls=LaunchCommand, help=LAUNCH_HELP, epilog=ACCELERATE_HELP,
    context_settings={"allow_interspersed_args": False, "help_option_names": ["-h", "--help"]},
)
@click.option("--dry-run", is_flag=True, help="Print the plan and the resolved settings; start nothing.")
@click.option("-m", "--module", "is_module", is_flag=True, help="SCRIPT is a module name, run as python -m.")
@click.option("--no-python", "no_python", is_flag=True,
              help="SCRIPT is a program run as it is, not through python (e.g. a shell script).")
@click.option("--config-file", type=str, default=None,
              help="A config file used instead of ./acc.toml: acc's TOML, or an Accelerate YAML config.")
@click.argument("script", metavar="SCRIPT")
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[ARGS]...")
@click.pass_context
def launch(ctx: click.Context, dry_run: bool, is_module: bool, no_python: bool, config_file: str | None, script: str,
           script_args: tuple[str, ...], **setting_values: Any) -> None:
    from acc.launcher import orchestrate

    if is_module and no_python:
        raise ConfigError("-m/--module and --no-python exclude each other: a module is run by python")
    assembly = resolved_assembly(ctx, setting_values, config_file)
    target = Target(script, tuple(script_args), is_module, no_python)
    plan = orchestrate.make_plan(assembly)
    if not (dry_run or no_python) and assembly.settings["start_method"] != "spawn" and plan.engine != "pjrt":
        from acc.launcher import worker_memory

        # forked workers inherit this allocator
        worker_memory.reexec_for(assembly.settings["worker_memory"], assembly.settings["huge_pages"])
    if assembly.detection_line and not dry_run:
        click.echo(f"acc: {assembly.detection_line}", err=True)
    if no_python and plan.engine == "pjrt":
        raise LaunchError("--no-python cannot be used with the xla backend: its workers run a Python script")
    orchestrate.check_target(target)
    notes = launch_notes(ctx, assembly)
    if dry_run:
        from acc.launcher.describe import describe

        click.echo(describe(assembly, plan, target))
        for note in notes:
            click.echo(f"note: {note}")
        return
    for note in notes:
        click.echo(f"acc: note: {note}", err=True)
    from acc.launcher import preflight

    if preflight.needed(plan):
        click.echo(f"acc launch: {preflight.run(plan, assembly.settings, assembly.cluster)}", err=True)
    if plan.engine == "task" and plan.env.get("RANK") == "0":  # the elastic engine says it once its store listens
        from acc.launcher import listen

        click.echo(f"acc launch: listening: {listen.describe(plan, started=True)}", err=True)
    env = orchestrate.worker_environment(assembly, plan)
    run_dir = orchestrate.record_run(assembly, plan, target)
    if run_dir is not None:
        env["ACC_RUN_DIR"] = str(run_dir.resolve())
    env.update(orchestrate.logging_environment(assembly, run_dir))
    code = orchestrate.execute(plan, target, env)
    from acc.cli.ending import finish

    finish(code)


def resolved_assembly(ctx: click.Context, setting_values: dict[str, Any], config_file: str | None) -> Assembly:
    """The assembly with every parsed flag applied (a LaunchCommand's callback calls this first); each flag's
    source is the spelling the user typed (`flag --num_processes`, `flag --mixed_precision`)."""
    assembly: Assembly = ctx.meta[_META_KEY]
    translation: LaunchTranslation | None = ctx.meta.get(_TRANSLATION_KEY)
    flags = {name.replace("__", "."): v for name, v in setting_values.items() if v is not None and v != ()}
    for name, raw in flags.items():
        if name in assembly.registry and name != "nproc":
            _converted(assembly.registry[name], raw, _typed(assembly.registry[name], translation))
    chosen = assembly.settings
    if assembly.detected or flags.get("backend", chosen["backend"]) != chosen["backend"] or \
            list(flags.get("plugins", chosen["plugins"])) != chosen["plugins"]:  # (detection weighs every flag)
        result = assemble(flags=flags, config_file=config_file, detect=True,  # the peek missed a choice: start over
                          cluster=True)
    else:
        result = assembly.with_flags(flags)
    _mark_sources(result.settings.sources, flags, result.registry, translation)
    return result


def _mark_sources(sources: dict[str, str], flags: dict[str, Any], registry: SettingsRegistry,
                  translation: LaunchTranslation | None) -> None:
    if translation is None:
        return
    for name in flags:
        if name == "nproc" and translation.nproc is not None and "--nproc" not in translation.typed:
            sources[name] = translation.nproc[1]
        elif name in registry:
            typed = _typed(registry[name], translation)
            if typed:
                sources[name] = f"flag {typed}"


def launch_notes(ctx: click.Context, assembly: Assembly) -> list[str]:
    """What the user should know about how Accelerate's flags and config keys were read."""
    translation: LaunchTranslation | None = ctx.meta.get(_TRANSLATION_KEY)
    notes = list(translation.notes) if translation else []
    for cfg in assembly.files:
        notes += cfg.notes
    return notes


