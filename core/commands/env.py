"""Accelerate's `accelerate.commands.env` for acc: `env_command_parser` and `env_command`, which prints the facts a
bug report needs and returns them as a dict under Accelerate's keys (the `acc` executable's location stands under
"`accelerate` bash location", acc's version under "`Accelerate` version"), followed by acc's own rows: the
CPUs and CUDA devices, the config files and settings acc resolves, and each installed backend's and plugin's report.

The figures come from `acc.runtime.environment_report`, which `acc env` prints too. Importing this module does not
import torch; running `env_command` does.
"""

from __future__ import annotations

import argparse
import os
import platform
from shutil import which
from typing import Any

from acc.assembly.hardware import visible_cuda_devices
from acc.commands.config.config_args import default_config_file, load_config_from_file
from acc.compat.dropin import describe as describe_accelerate
from acc.contract.version import __version__
from acc.errors import AccError

EXECUTABLE = "acc"  # what `which` looks for: acc's command stands where `accelerate` did


def env_command_parser(subparsers: Any = None) -> argparse.ArgumentParser:
    """The parser of `env` (a sub-parser of `subparsers` when given, whose default `func` is `env_command`)."""
    if subparsers is not None:
        parser = subparsers.add_parser("env")
    else:
        parser = argparse.ArgumentParser("Accelerate env command")
    parser.add_argument(
        "--config_file", "--config-file", "-c", default=None,
        help="The config file to report (an Accelerate YAML/JSON config, or acc's TOML for acc's own rows); "
             f"by default Accelerate's default config ({default_config_file}) when it exists.",
    )
    if subparsers is not None:
        parser.set_defaults(func=env_command)
    return parser


def _accelerate_config(config_file: str | None) -> Any:
    """Accelerate's config as a dict (`load_config_from_file(...).to_dict()`, credential-like values redacted), or
    'Not found' when no file was given and Accelerate's default file does not exist. An acc TOML file is reported
    by acc's rows instead."""
    if config_file is None and not os.path.isfile(default_config_file):
        return "Not found"
    if config_file is not None and config_file.lower().endswith(".toml"):
        return f"{config_file} is acc's TOML, not an Accelerate config: see the `acc` rows above"
    from acc.assembly.redact import redact_value

    return {key: redact_value(key, value) for key, value in load_config_from_file(config_file).to_dict().items()}


def _acc_rows(config_file: str | None) -> dict[str, Any]:
    """acc's own rows: hardware acc reads without torch, the resolved config, each plugin's report."""
    from acc.assembly.choose import assemble
    from acc.runtime import environment_report as report

    rows: dict[str, Any] = {"`acc` CPUs": str(os.cpu_count()),
                            "`acc` CUDA devices (driver)": str(visible_cuda_devices())}
    try:
        found = assemble(config_file=config_file)
    except AccError as exc:  # a config acc cannot read still leaves the rest of the report worth having
        rows["`acc` config"] = f"error: {exc}"
        return rows
    rows["`acc` config"] = dict(report.config_rows(found))
    for plugin in report.plugin_reports(found.settings):
        key = f"`acc` plugin {plugin.name} ({plugin.distribution} {plugin.version})"
        rows[key] = plugin.error if plugin.error is not None else dict(plugin.rows)
    return rows


def _shown(value: Any) -> str:
    if isinstance(value, dict):
        return "".join(f"\n\t- {k}: {v}" for k, v in value.items()) if value else " -"
    return f" {value}"


def env_command(args: argparse.Namespace) -> dict[str, Any]:
    """Print the report (Accelerate's lines, then acc's, then the Accelerate config) and return it as a dict."""
    from acc.runtime import environment_report as report

    view = report.torch_view()
    accelerate_config = _accelerate_config(args.config_file)
    info: dict[str, Any] = {
        "`Accelerate` version": __version__,
        "Platform": platform.platform(),
        "`accelerate` bash location": which(EXECUTABLE) or "Not found",
        "Python version": platform.python_version(),
        "Numpy version": report.numpy_version(),
        "PyTorch version": view.version,
        "PyTorch accelerator": view.accelerator,
        "System RAM": report.system_ram(),
        "`import accelerate`": describe_accelerate(),
        **dict(view.device_rows),
        **_acc_rows(args.config_file),
    }

    print("\nCopy-and-paste the text below in your GitHub issue\n")
    print("\n".join(f"- {prop}:{_shown(val)}" for prop, val in info.items()))
    print("- `Accelerate` default config:" if args.config_file is None else "- `Accelerate` config passed:")
    if isinstance(accelerate_config, dict):
        print("\n".join(f"\t- {prop}: {val}" for prop, val in accelerate_config.items()))
    else:
        print(f"\t{accelerate_config}")

    info["`Accelerate` configs"] = accelerate_config
    return info


def main() -> int:
    """`python -m acc.commands.env`: print the report."""
    env_command(env_command_parser().parse_args())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
