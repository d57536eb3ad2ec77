"""Accelerate's `accelerate.commands.test` for acc: `test_command_parser` and `test_command`, which runs acc's own
end-to-end check (`acc/test_utils/scripts/test_script.py`) under `acc launch` (the `acc` executable beside this
interpreter), with the given config file, and says whether the setup is ready for distributed training.

Importing this module does not import torch; `test_command` does (through `acc.test_utils`), and so does the
launched script.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

SUCCESS = "Test is a success! You are ready for your distributed training!"


def test_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of `test` (a sub-parser of `subparsers` when given, whose default `func` is `test_command`)."""
    if subparsers is not None:
        parser = subparsers.add_parser("test")
    else:
        parser = argparse.ArgumentParser("Accelerate test command")
    parser.add_argument(
        "--config_file", "--config-file", default=None,
        help="The config file `acc launch` runs the test with (an Accelerate YAML config, or acc's TOML); without "
             "it, `acc launch` resolves the run as it always does (./acc.toml, the user config, detection).",
    )
    if subparsers is not None:
        parser.set_defaults(func=test_command)
    return parser


def test_script_path() -> Path:
    """acc's version of Accelerate's `test_utils/scripts/test_script.py`, in the installed package."""
    import acc

    return Path(acc.__file__).resolve().parent / "test_utils" / "scripts" / "test_script.py"


def test_command(args: argparse.Namespace) -> None:
    """Run the test script under `acc launch`; print the success line when it passes. A failing run raises
    RuntimeError with the command, its exit code and its stderr (as Accelerate's `execute_subprocess_async`)."""
    from acc.test_utils.testing import execute_subprocess_async, get_launch_command

    config_file = getattr(args, "config_file", None)
    cmd = get_launch_command() + (["--config-file", str(config_file)] if config_file else [])
    cmd.append(str(test_script_path()))
    result = execute_subprocess_async(cmd)
    if result.returncode == 0:
        print(SUCCESS)


def main() -> None:
    """`python -m acc.commands.test`: run the test."""
    test_command(test_command_parser().parse_args())


if __name__ == "__main__":
    main()
