"""Accelerate's `accelerate.commands.tpu` for acc: `accelerate tpu-config` runs setup commands on every worker of a
TPU pod through `gcloud compute tpus tpu-vm ssh ... --worker all`, before a launch. The gcloud command line is built
as Accelerate builds it: the TPU's name and zone and the commands (or command file) come from the flags, else from
the config file; `--debug` prints it (`Running gcloud ...`) instead of running it.

Torch-free; it never imports `acc.cli`.
"""

import argparse
import os
import subprocess
from typing import Any, Optional

from packaging.version import InvalidVersion, Version, parse

from acc.commands.config.config_args import default_config_file, load_config_from_file

_description = "Run commands across TPU VMs for initial setup before running `accelerate launch`."


def tpu_command_parser(subparsers: Optional[Any] = None) -> argparse.ArgumentParser:
    """The `tpu-config` parser: a sub-command of `subparsers` when given (running `tpu_command_launcher`), else its
    own. Each option is accepted with `_` or `-` between its words."""
    if subparsers is not None:
        parser = subparsers.add_parser("tpu-config", description=_description)
    else:
        parser = argparse.ArgumentParser("acc tpu-config", description=_description)
    config_args = parser.add_argument_group(
        "Config Arguments", "Arguments that can be configured through `accelerate config`."
    )
    config_args.add_argument("--config_file", "--config-file", type=str, default=None,
                             help="Path to the config file to use for accelerate.")
    config_args.add_argument("--tpu_name", "--tpu-name", default=None,
                             help="The name of the TPU to use. If not specified, will use the TPU specified in the "
                                  "config file.")
    config_args.add_argument("--tpu_zone", "--tpu-zone", default=None,
                             help="The zone of the TPU to use. If not specified, will use the zone specified in the "
                                  "config file.")
    pod_args = parser.add_argument_group("TPU Arguments", "Arguments for options ran inside the TPU.")
    pod_args.add_argument("--use_alpha", "--use-alpha", action="store_true",
                          help="Whether to use `gcloud alpha` when running the TPU training script instead of "
                               "`gcloud`.")
    pod_args.add_argument("--command_file", "--command-file", default=None,
                          help="The path to the file containing the commands to run on the pod on startup.")
    pod_args.add_argument("--command", action="append", nargs="+",
                          help="A command to run on the pod. Can be passed multiple times.")
    pod_args.add_argument("--install_accelerate", "--install-accelerate", action="store_true",
                          help="Whether to install accelerate on the pod. Defaults to False.")
    pod_args.add_argument("--accelerate_version", "--accelerate-version", default="latest",
                          help="The version of accelerate to install on the pod. If not specified, will use the "
                               "latest pypi version. Specify 'dev' to install from GitHub.")
    pod_args.add_argument("--debug", action="store_true",
                          help="If set, will print the command that would be run instead of running it.")
    if subparsers is not None:
        parser.set_defaults(func=tpu_command_launcher)
    return parser


def _pip_target(version: str) -> str:
    # The pod is set up for the script's `import accelerate`: the line installs the `accelerate` distribution, as
    # Accelerate's command does (and its tests expect). A drop-in `accelerate` distribution backed by acc is
    # planned, so this text stays Accelerate's rather than naming acc's own distribution.
    if version == "dev":
        return "git+https://github.com/huggingface/accelerate.git"
    if version == "latest":
        return "accelerate -U"
    try:
        parsed = parse(version)
    except InvalidVersion:
        raise ValueError(f"--accelerate_version {version!r} is not a version: give 'latest' (the newest release), "
                         "'dev' (GitHub's main branch) or a release such as 1.15.0") from None
    return f"accelerate=={version}" if isinstance(parsed, Version) else version


def tpu_command_launcher(args: argparse.Namespace) -> None:
    """Build the gcloud command for `args` (filling unset options from the config file) and run it, or print it
    with --debug."""
    if args.config_file is not None or os.path.isfile(default_config_file):
        defaults = load_config_from_file(args.config_file)
        command_file = getattr(defaults, "command_file", None)
        commands = getattr(defaults, "commands", None)
        if not args.command_file and command_file is not None and not args.command:
            args.command_file = command_file
        if not args.command and commands is not None:
            args.command = commands
        if not args.tpu_name:
            args.tpu_name = getattr(defaults, "tpu_name", None)
        if not args.tpu_zone:
            args.tpu_zone = getattr(defaults, "tpu_zone", None)
    args.accelerate_version = _pip_target(args.accelerate_version)

    if not args.command_file and not args.command:
        raise ValueError("No command to run on the pod: pass --command COMMAND (as often as needed) or "
                         "--command_file FILE, or set `commands` or `command_file` in the config file.")
    for option, value in (("tpu_name", args.tpu_name), ("tpu_zone", args.tpu_zone)):
        if not value:
            raise ValueError(f"No TPU {option[4:]} was given: pass --{option} or set `{option}` in the config file "
                             f"({args.config_file or default_config_file}).")

    if args.command_file:
        with open(args.command_file, encoding="utf-8") as f:
            args.command = [f.read().splitlines()]
    # --command gives a list per use (each of its words a line, as in Accelerate); a config's commands are lines
    if isinstance(args.command[0], list):
        args.command = [line for cmd in args.command for line in cmd]
    lines = ["cd /usr/share"]
    if args.install_accelerate:
        lines.append(f"pip install {args.accelerate_version}")
    lines += args.command
    args.command = "; ".join(lines)

    cmd = ["gcloud"]
    if args.use_alpha:
        cmd.append("alpha")
    cmd += ["compute", "tpus", "tpu-vm", "ssh", args.tpu_name, "--zone", args.tpu_zone, "--command", args.command,
            "--worker", "all"]
    if args.debug:
        print(f"Running {' '.join(cmd)}")
        return
    try:
        result = subprocess.run(cmd)
    except FileNotFoundError:
        raise FileNotFoundError("`gcloud` was not found on PATH: install the Google Cloud CLI "
                                "(https://cloud.google.com/sdk/docs/install) and log in, or pass --debug to print the "
                                "command instead of running it") from None
    if result.returncode != 0:
        raise RuntimeError(f"`{' '.join(cmd[:6])} ...` exited with code {result.returncode}; gcloud's output above "
                           "says why")
    print("Successfully setup pod.")
