"""The `acc` command line (click): `acc launch`, `acc check`, `acc config`, `acc env`, `acc plugins`, `acc migrate`,
`acc estimate-memory`, `acc merge-weights`, `acc new-backend`, `acc plot`, and Accelerate's `acc test`,
`acc to-fsdp2`, `acc tpu-config` (their argparse parsers, from `acc.commands`).

The top layer: it may import every package below it, and nothing imports it. Torch-free: commands import torch
only when they run something that needs it (`acc --help`, `acc plugins`, `acc launch --dry-run` never do).
"""

from __future__ import annotations

import sys
from typing import Any

import click

from acc.cli.ending import FAST_EXIT, finish  # noqa: F401  (finish: acc.cli's name before cli/ending.py)
from acc.contract.version import __version__
from acc.errors import AccError


class AccGroup(click.Group):
    """Shows acc's own errors as one clear message and a non-zero exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except AccError as exc:
            error = click.ClickException(str(exc))
            error.exit_code = exc.exit_code
            raise error from None


@click.group(cls=AccGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "-V", "--version", prog_name="acc", message="%(prog)s %(version)s (acc-core)")
def cli() -> None:
    """acc: run one PyTorch training loop on CPU, GPUs (DDP), FSDP, DeepSpeed, XLA or MPS.

    \b
    Start with:
      acc plugins                          installed backends and plugins
      acc launch train.py                  run on the default (cpu) backend
      acc launch --backend ddp --nproc 2 train.py
      acc launch --dry-run ...             show the plan and where each setting came from
    """


def _register_commands() -> None:
    from acc.cli.accelerate_commands import test, to_fsdp2, tpu_config
    from acc.cli.check import check
    from acc.cli.config import config
    from acc.cli.env import env
    from acc.cli.estimate import estimate_memory
    from acc.cli.launch import launch
    from acc.cli.merge import merge_weights
    from acc.cli.migrate import migrate
    from acc.cli.new_backend import new_backend
    from acc.cli.plot import plot
    from acc.cli.plugins import plugins

    cli.add_command(launch)
    cli.add_command(check)
    cli.add_command(config)
    cli.add_command(plugins)
    cli.add_command(env)
    cli.add_command(estimate_memory)
    cli.add_command(merge_weights)
    cli.add_command(new_backend)
    cli.add_command(migrate)
    cli.add_command(plot)
    for command in (test, to_fsdp2, tpu_config):  # Accelerate's commands, with Accelerate's arguments
        cli.add_command(command)


_register_commands()


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    FAST_EXIT["on"] = True
    cli.main(args=argv, prog_name="acc")


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
