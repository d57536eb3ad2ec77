"""Accelerate's `accelerate.commands.launch` for acc: `launch_command_parser` (every option of `accelerate launch`,
with Accelerate's fields, defaults and both spellings), `_validate_launch_command` (Accelerate's checks and its
config-file defaults) and `launch_command`, which runs the script with the `acc launch` executable.

`launch_command` hands `acc launch` the options that were given (on the command line, or set on the Namespace),
in Accelerate's spelling, and the config file (Accelerate's default one when none is given and it exists, as
`accelerate launch` reads it; `acc launch` itself reads only the files it is given): `acc launch` reads them
with Accelerate's meaning (`acc.compat.accelerate_launch`), so both paths resolve one run the same way. Torch is
imported only by the validation.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from typing import Any

from acc.compat.accelerate_launch_options import GROUPS, Option, all_options
from acc.compat.environment import get_int_from_env

logger = logging.getLogger(__name__)

DESCRIPTION = ("Launch a python script on acc (CPU, GPUs, FSDP, DeepSpeed, TPU) with `accelerate launch`'s options. "
               "An option can be spelled with hyphens (`--num-processes=2`) or underscores (`--num_processes=2`).")
_BACKEND_FLAGS = ("multi_gpu", "cpu", "tpu", "use_deepspeed", "use_fsdp")
_MULTI_DEVICE = ("MULTI_GPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA", "MULTI_MUSA", "MULTI_XPU", "MULTI_HPU",
                 "MULTI_NEURON")


# ---------------------------------------------------------------------------------------------- the parser


def _mark(namespace: argparse.Namespace, dest: str) -> None:
    given = getattr(namespace, "nondefault", None)
    if given is None:
        given = set()
        namespace.nondefault = given
    given.add(dest)


class _Given(argparse.Action):
    """Stores the value and records the option in `namespace.nondefault` (what was given, not defaulted)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, values)
        _mark(namespace, self.dest)


class _GivenConst(argparse.Action):
    def __init__(self, option_strings: list[str], dest: str, const: Any = True, default: Any = False,
                 help: str | None = None) -> None:  # noqa: A002 - argparse's own keyword
        super().__init__(option_strings, dest, nargs=0, const=const, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, self.const)
        _mark(namespace, self.dest)


class _GivenAppend(argparse.Action):
    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        setattr(namespace, self.dest, [*(getattr(namespace, self.dest, None) or []), values])
        _mark(namespace, self.dest)


class _HelpFormatter(argparse.HelpFormatter):
    """Shows each option once, in its underscore spelling (the hyphen spelling is accepted, not listed)."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        shown = [s for s in action.option_strings if "-" not in s[2:]]
        metavar = "" if action.nargs == 0 else " " + self._format_args(action, action.dest.upper())
        return ", ".join(s + metavar for s in shown)

    def _fill_text(self, text: str, width: int, indent: str) -> str:  # an option is never split at its hyphens
        import textwrap

        return textwrap.fill(" ".join(text.split()), width, initial_indent=indent, subsequent_indent=indent,
                             break_on_hyphens=False)


def _truth(text: str) -> bool:
    from acc.compat.environment import str_to_bool

    return bool(str_to_bool(text, to_bool=True))


def _truths(text: str) -> tuple[bool, ...]:
    return tuple(_truth(part) for part in text.split(","))


_TYPES = {"str": str, "int": int, "float": float, "bool": bool, "truth": _truth, "truths": _truths}


def _add(container: Any, option: Option) -> None:
    strings = [f"--{option.name}"] + ([f"--{option.name.replace('_', '-')}"] if "_" in option.name else [])
    if option.short:
        strings.insert(0, option.short)
    dest = option.dest or option.name
    if option.kind == "flag":
        container.add_argument(*strings, dest=dest, action=_GivenConst, const=not option.const_false,
                               default=option.default,
                               help=f"Accelerate's --{option.name}.")
    elif option.kind == "append":
        container.add_argument(*strings, dest=dest, action=_GivenAppend, type=str, default=None,
                               help=f"Accelerate's --{option.name} (repeatable).")
    else:
        container.add_argument(*strings, dest=dest, action=_Given, type=_TYPES[option.kind], default=option.default,
                               choices=list(option.choices) if option.choices else None,
                               help=f"Accelerate's --{option.name}.")


def launch_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """Accelerate's `accelerate launch` parser (as a subcommand of `subparsers` when given)."""
    kwargs: dict[str, Any] = dict(description=DESCRIPTION, add_help=False, allow_abbrev=False,
                                  formatter_class=_HelpFormatter)
    if subparsers is not None:
        parser = subparsers.add_parser("launch", **kwargs)
    else:
        parser = argparse.ArgumentParser("acc launch", **kwargs)
    parser.add_argument("-h", "--help", action="help", help="Show this help message and exit.")
    for title, description, options in GROUPS:
        container = parser.add_argument_group(title, description) if title else parser
        for option in options:
            _add(container, option)
    parser.add_argument("training_script", type=str, help="The script to launch, followed by its arguments.")
    parser.add_argument("training_script_args", nargs=argparse.REMAINDER, help="The script's arguments.")
    if subparsers is not None:
        parser.set_defaults(func=launch_command)
    return parser


# ---------------------------------------------------------------------------------------------- validation


def _device_count() -> int:
    import torch

    for name in ("xpu", "mlu", "sdaa", "musa", "npu", "hpu", "neuron"):
        device = getattr(torch, name, None)
        if device is not None and getattr(device, "is_available", lambda: False)():
            return int(device.device_count())
    return int(torch.cuda.device_count())


def _apply_config(args: argparse.Namespace, defaults: Any) -> bool:
    """Accelerate's rule for a config file: it fills what the command line left unset. True when the mixed
    precision came from it."""
    from acc.contract.enums import ComputeEnvironment, DistributedType

    kind = str(getattr(defaults.distributed_type, "value", defaults.distributed_type))
    if not any(getattr(args, f) for f in ("multi_gpu", "tpu", "tpu_use_cluster", "use_deepspeed", "use_fsdp",
                                          "use_megatron_lm")):
        args.use_deepspeed = kind == DistributedType.DEEPSPEED.value
        args.multi_gpu = kind in _MULTI_DEVICE
        args.tpu = kind == DistributedType.XLA.value
        args.use_fsdp = kind == DistributedType.FSDP.value
        args.use_megatron_lm = kind == DistributedType.MEGATRON_LM.value
        args.tpu_use_cluster = bool(getattr(defaults, "tpu_use_cluster", False)) if args.tpu else False
        args.use_parallelism_config = bool(getattr(defaults, "parallelism_config", None))
    if args.gpu_ids is None:
        args.gpu_ids = defaults.gpu_ids if getattr(defaults, "gpu_ids", None) is not None else "all"
    if args.multi_gpu and args.num_machines is None:
        args.num_machines = defaults.num_machines
    if (len(args.gpu_ids.split(",")) < 2 and args.gpu_ids != "all" and args.multi_gpu
            and (args.num_machines or 1) <= 1):
        raise ValueError(f"--gpu_ids {args.gpu_ids!r} names fewer than two GPUs for a multi-GPU run: give at least "
                         "two ids (--gpu_ids 0,1) or --gpu_ids all")
    environment = str(getattr(defaults.compute_environment, "value", defaults.compute_environment))
    if environment == ComputeEnvironment.LOCAL_MACHINE.value:
        prefixes = {"fsdp_config": "fsdp_", "fp8_config": "fp8_", "dynamo_config": "dynamo_"}
        given = getattr(args, "nondefault", set())
        for name, value in vars(defaults).items():
            if isinstance(value, dict):
                prefix = prefixes.get(name, "")
                for key, item in value.items():
                    key = key if not prefix or key.startswith(prefix) else prefix + key
                    if key not in given:
                        setattr(args, key, item)
            elif name not in ("compute_environment", "mixed_precision", "distributed_type") and \
                    getattr(args, name, None) is None:
                setattr(args, name, value)
    if not args.debug:
        args.debug = bool(getattr(defaults, "debug", False))
    from_config = False
    if not args.mixed_precision:
        precision = getattr(defaults, "mixed_precision", None)
        args.mixed_precision = "no" if precision is None else str(getattr(precision, "value", precision))
        from_config = precision is not None
    if args.dynamo_backend is None:
        args.dynamo_backend = "no"
    if args.num_processes == -1:
        raise ValueError("the config file leaves num_processes to the command line (-1): pass --num_processes N")
    return from_config


def _fill_defaults(args: argparse.Namespace, warned: list[str]) -> None:
    """No config file: Accelerate's defaults for what was not given (warned about, as Accelerate does)."""
    if args.num_processes is None:
        args.num_processes = _device_count()
        warned.append(f"\t`--num_processes` was set to a value of `{args.num_processes}`")
    if args.debug is None:
        args.debug = False
    if not args.multi_gpu and args.num_processes > 1 and _device_count() > 1:
        warned.append("\t\tMore than one GPU was found, enabling multi-GPU training.\n"
                      "\t\tIf this was unintended please pass in `--num_processes=1`.")
        args.multi_gpu = True
    if args.num_machines is None:
        warned.append("\t`--num_machines` was set to a value of `1`")
        args.num_machines = 1
    if args.mixed_precision is None:
        warned.append("\t`--mixed_precision` was set to a value of `'no'`")
        args.mixed_precision = "no"
    if not hasattr(args, "use_cpu"):
        args.use_cpu = args.cpu
    if args.dynamo_backend is None:
        warned.append("\t`--dynamo_backend` was set to a value of `'no'`")
        args.dynamo_backend = "no"


def _cpu_threads(args: argparse.Namespace, warned: list[str]) -> None:
    args.num_cpu_threads_per_process = get_int_from_env(["OMP_NUM_THREADS"], 1)
    if getattr(args, "use_cpu", False) and args.num_processes >= 1 and get_int_from_env(["OMP_NUM_THREADS"], 0) == 0:
        local = get_int_from_env(["MPI_LOCALNRANKS", "OMPI_COMM_WORLD_LOCAL_SIZE", "MV2_COMM_WORLD_LOCAL_SIZE"],
                                 max(int(args.num_processes / (args.num_machines or 1)), 1))
        try:
            import psutil

            cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
        except ImportError:
            cores = os.cpu_count() or 1
        threads = int(cores / local)
        if threads > 1:
            args.num_cpu_threads_per_process = threads
            warned.append(f"\t`--num_cpu_threads_per_process` was set to `{threads}` to improve out-of-box "
                          "performance when training on CPUs")


def _validate_launch_command(args: argparse.Namespace) -> tuple[argparse.Namespace, Any, bool]:
    """Accelerate's validation: the checks, then the config file's values (or Accelerate's defaults) for what the
    command line left unset. Returns (args, the config file's object or None, whether mixed precision came
    from it). Raises ValueError for contradicting options."""
    chosen = [f"--{f}" for f in _BACKEND_FLAGS if getattr(args, f, False)]
    if len(chosen) > 1:
        raise ValueError(f"{', '.join(chosen)} were given: use one of --cpu, --multi_gpu, --tpu, --use_deepspeed, "
                         "--use_fsdp at a time")
    if args.multi_gpu and args.num_processes is not None and args.num_processes < 2:
        raise ValueError(f"--multi_gpu with --num_processes {args.num_processes}: a multi-GPU run needs at least 2 "
                         "processes (drop --multi_gpu for one)")
    if (not args.use_fsdp or str(args.fsdp_version) == "1") and args.use_parallelism_config:
        raise ValueError("--use_parallelism_config needs --use_fsdp and --fsdp_version 2")
    from acc.commands.config.config_args import default_config_file, load_config_from_file

    defaults, warned, from_config = None, [], False
    if args.config_file is not None or (os.path.isfile(default_config_file) and not args.cpu):
        defaults = load_config_from_file(args.config_file)
        from_config = _apply_config(args, defaults)
    else:
        _fill_defaults(args, warned)
    environment = str(getattr(getattr(defaults, "compute_environment", None), "value", ""))
    if (defaults is None or environment != "AMAZON_SAGEMAKER") and args.num_cpu_threads_per_process is None:
        _cpu_threads(args, warned)
    if warned:
        logger.warning("The following values were not passed to `acc launch` and had defaults used instead:\n%s\n"
                       "To avoid this warning pass in values for each of the problematic parameters or run "
                       "`acc config`.", "\n".join(warned))
    return args, defaults, from_config


# ---------------------------------------------------------------------------------------------- launching


def _given(args: argparse.Namespace, option: Option) -> bool:
    dest = option.dest or option.name
    if hasattr(args, "nondefault"):
        return dest in args.nondefault
    default = option.default
    if isinstance(default, str) and option.kind in _TYPES:
        default = _TYPES[option.kind](default)  # argparse converts a string default with the option's type
    value = getattr(args, dest, default)
    return value is not None and value != default and not (option.kind == "flag" and value is False)


def acc_launch_argv(args: argparse.Namespace) -> list[str]:
    """The `acc launch` arguments for a Namespace from `launch_command_parser`: the options that were given, in
    Accelerate's spelling, then the script and its arguments."""
    argv: list[str] = []
    cluster_done = False
    for option in all_options():
        if not _given(args, option):
            continue
        dest = option.dest or option.name
        value = getattr(args, dest)
        if dest == "tpu_use_cluster":
            if not cluster_done:
                argv.append("--tpu_cluster" if value else "--no_tpu_cluster")
                cluster_done = True
        elif option.kind == "flag":
            if value:
                argv.append(f"--{option.name}")
        elif option.kind == "append":
            for item in value or []:
                argv.append(f"--{option.name}={item}")
        elif option.kind == "truths":
            argv.append(f"--{option.name}=" + ",".join(str(v).lower() for v in value))
        elif value is not None:
            argv.append(f"--{option.name}={str(value).lower() if isinstance(value, bool) else value}")
    return argv + [args.training_script, *(args.training_script_args or [])]


def launch_command(args: argparse.Namespace) -> None:
    """Run the script as `accelerate launch` would, with `acc launch`. A failing run raises
    subprocess.CalledProcessError (exits 1 with --quiet), as Accelerate's launcher does."""
    from acc.commands.config.config_args import default_config_file

    argv = acc_launch_argv(args)
    if args.config_file is None and os.path.isfile(default_config_file) and not args.cpu:
        argv.insert(0, f"--config_file={default_config_file}")  # Accelerate reads its default config file
    _validate_launch_command(argparse.Namespace(**vars(args)))  # Accelerate's errors, before anything starts
    cmd = [sys.executable, "-m", "acc", "launch", *argv]
    process = subprocess.run(cmd)
    if process.returncode != 0:
        if getattr(args, "quiet", False):
            sys.exit(1)
        raise subprocess.CalledProcessError(returncode=process.returncode, cmd=cmd)


def main() -> None:
    launch_command(launch_command_parser().parse_args())


__all__ = ["DESCRIPTION", "launch_command_parser", "_validate_launch_command", "acc_launch_argv", "launch_command",
           "main"]
