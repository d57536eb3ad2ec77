"""`acc estimate-memory`: parameter and training memory of a model built from an import path, on the meta
device (nothing is downloaded or allocated). Imports torch only when it runs."""

from __future__ import annotations

import ast
import importlib
import json
import os
import sys
import textwrap
from typing import Any

import click

from acc.errors import AccError, did_you_mean

DTYPES = (("float32", 4), ("float16/bfloat16", 2), ("int8", 1))
FORMULA = ("training = weights + gradients + 2 Adam moments, each in the dtype: 4 x the parameters "
           "(activations not included; mixed precision with float32 master weights and moments needs "
           "16 bytes per parameter). int8 is for inference only.")


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def _arguments(args: tuple[str, ...]) -> tuple[list[Any], dict[str, Any]]:
    positional, keywords = [], {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.isidentifier():
            keywords[key] = _value(value)
        elif keywords:
            raise AccError(f"positional argument {arg!r} follows a key=value argument")
        else:
            positional.append(_value(arg))
    return positional, keywords


def _resolve(target: str) -> Any:
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise AccError(f"'{target}': give the model as package.module:factory or package.module:ClassName")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # like `python -m`: modules next to you are found
    try:
        obj = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and (module_name == exc.name or module_name.startswith(exc.name + ".")):
            raise AccError(f"cannot import '{module_name}': there is no module named '{exc.name}' (is it installed, "
                           "or is this the directory that holds it?)") from None
        raise AccError(f"importing '{module_name}' failed: {exc}") from None
    except Exception as exc:  # the user's module failing to import is the user's error to see
        raise AccError(f"importing '{module_name}' failed: {type(exc).__name__}: {exc}") from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            names = [n for n in dir(obj) if not n.startswith("_")]
            raise AccError(f"'{getattr(obj, '__name__', module_name)}' has no attribute '{part}'"
                           f"{did_you_mean(part, names)}")
        obj = getattr(obj, part)
    return obj


def _build(target: str, obj: Any, args: list[Any], kwargs: dict[str, Any]) -> Any:
    from torch import nn

    from acc.big_model import init_empty_weights

    if isinstance(obj, nn.Module):
        return obj
    if not callable(obj):
        raise AccError(f"'{target}' is a {type(obj).__name__}, not a model class or a function that builds one")
    failure: Exception | None = None
    for include_buffers in (True, False):  # buffers computed at build time may need real tensors
        try:
            with init_empty_weights(include_buffers=include_buffers):
                model = obj(*args, **kwargs)
            break
        except Exception as exc:  # noqa: BLE001 - reported below if the second try fails too
            failure = exc
    else:
        raise AccError(f"building '{target}' failed: {type(failure).__name__}: {failure}")
    if not isinstance(model, nn.Module):
        raise AccError(f"'{target}' returned a value of type {type(model).__name__}, not a torch.nn.Module")
    return model


def estimate(target: str, args: tuple[str, ...] = (), no_split: tuple[str, ...] = ()) -> dict[str, Any]:
    """The figures `acc estimate-memory` prints, as a dict."""
    from acc.big_model import compute_module_sizes, largest_unit

    positional, keywords = _arguments(args)
    model = _build(target, _resolve(target), positional, keywords)
    parameters = {id(p): p for p in model.parameters()}
    count = sum(p.numel() for p in parameters.values())
    buffers = sum(b.numel() * b.element_size() for b in {id(b): b for b in model.buffers()}.values())
    unit, _ = largest_unit(model, list(no_split))
    modules = dict(model.named_modules())
    rows = {}
    for name, size in DTYPES:
        sizes = compute_module_sizes(model, dtype=name.split("/")[0])
        rows[name] = {"parameters_bytes": count * size, "training_bytes": 4 * count * size if size > 1 else None,
                      "largest_layer_bytes": sizes.get(unit, 0)}
    return {"target": target, "model": type(model).__name__, "parameters": count, "buffers_bytes": buffers,
            "largest_layer": {"name": unit, "class": type(modules[unit]).__name__ if unit in modules else "tensor"},
            "dtypes": rows, "training_formula": FORMULA}


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
