"""`acc estimate-memory`: parameter and training memory of a model built from an import path, on the meta
device (nothing is downloaded or allocated). The model and its figures are `acc.big_model.estimate`'s (which
Accelerate's `estimate_command`, `acc.commands.estimate`, builds import paths with too); this module prints them.
Imports torch only when it runs."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import click


def estimate(target: str, args: tuple[str, ...] = (), no_split: tuple[str, ...] = ()) -> dict[str, Any]:
    """The figures `acc estimate-memory` prints, as a dict (`acc.big_model.estimate.memory_report`)."""
    from acc.big_model.estimate import memory_report

    return memory_report(target, args, no_split)


def _bytes(n: int | None) -> str:
    from acc.big_model.sizes import format_bytes

    return "-" if n is None else format_bytes(n)


@click.command("estimate-memory")
@click.argument("target")
@click.argument("args", nargs=-1)
@click.option("--no-split", "no_split", multiple=True, metavar="CLASS",
              help="A module class kept whole (repeatable): the largest layer is then the largest such module.")
@click.option("--json", "as_json", is_flag=True, help="Print the figures as JSON.")
def estimate_memory(target: str, args: tuple[str, ...], no_split: tuple[str, ...], as_json: bool) -> None:
    """Memory of a model's parameters and of training it, per dtype, and its largest layer.

    TARGET is package.module:factory or package.module:ClassName (found from the current directory
    too); ARGS are passed to it, as Python literals or key=value. The model is built on the meta
    device: nothing is downloaded or allocated.

    \b
      acc estimate-memory mypkg.models:build_gpt n_layer=24 n_embd=2048
      acc estimate-memory torchvision.models:resnet50 --json
    """
    from acc.big_model.estimate import FORMULA

    report = estimate(target, args, no_split)
    if as_json:
        click.echo(json.dumps(report, indent=2))
        return
    largest = report["largest_layer"]
    click.echo(f"{report['model']} from {target}: {report['parameters']:,} parameters"
               f" (+ {_bytes(report['buffers_bytes'])} of buffers), built on the meta device")
    layer = f"largest layer ({largest['name'] or '(model)'}, {largest['class']})"
    click.echo(f"{'dtype':18}  {'parameters':>12}  {'training (Adam)':>15}  {layer}")
    for name, row in report["dtypes"].items():
        click.echo(f"{name:18}  {_bytes(row['parameters_bytes']):>12}  {_bytes(row['training_bytes']):>15}  "
                   f"{_bytes(row['largest_layer_bytes'])}")
    click.echo(textwrap.fill(FORMULA, 100))
