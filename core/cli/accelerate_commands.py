"""Accelerate's commands that acc runs with Accelerate's own arguments: `acc test`, `acc to-fsdp2`, `acc tpu-config`
(argparse parsers in `acc.commands`; click hands them the arguments as given)."""

from __future__ import annotations

from typing import Any, Callable

import click

_PASS_THROUGH = {"ignore_unknown_options": True, "allow_extra_args": True, "help_option_names": []}


def _argparse_command(name: str, summary: str, load: Callable[[], tuple[Any, Any]]) -> click.Command:
    @click.command(name, context_settings=_PASS_THROUGH, add_help_option=False, help=summary,
                   short_help=summary.split(".")[0])
    @click.argument("args", nargs=-1, type=click.UNPROCESSED)
    def command(args: tuple[str, ...]) -> None:
        parser, run = load()
        try:
            run(parser.parse_args(list(args)))
        except (OSError, ValueError, RuntimeError) as exc:  # the command's own clear message, not a traceback
            raise click.ClickException(str(exc)) from None

    return command


def _test() -> tuple[Any, Any]:
    from acc.commands.test import test_command, test_command_parser

    return test_command_parser(), test_command


def _to_fsdp2() -> tuple[Any, Any]:
    from acc.commands.to_fsdp2 import to_fsdp2_command, to_fsdp2_command_parser

    return to_fsdp2_command_parser(), to_fsdp2_command


def _tpu() -> tuple[Any, Any]:
    from acc.commands.tpu import tpu_command_launcher, tpu_command_parser

    return tpu_command_parser(), tpu_command_launcher


test = _argparse_command("test", "Run acc's end-to-end check script under acc launch (Accelerate's `accelerate "
                                 "test`; --config_file FILE). -h lists its options.", _test)
to_fsdp2 = _argparse_command("to-fsdp2", "Rewrite an Accelerate FSDP1 config file for FSDP2 (Accelerate's "
                                         "`accelerate to-fsdp2`). -h lists its options.", _to_fsdp2)
tpu_config = _argparse_command("tpu-config", "Run a command on every TPU-pod worker through gcloud (Accelerate's "
                                             "`accelerate tpu-config`). -h lists its options.", _tpu)
