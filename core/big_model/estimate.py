"""Memory estimates of a model built on the meta device (nothing downloaded or allocated): the model named by an
import path `package.module:factory` (or `:ClassName`, called with literal arguments), acc's figures per dtype
(`memory_report`, what `acc estimate-memory` prints) and Accelerate's total size and largest layer
(`calculate_maximum_sizes`, what `accelerate estimate-memory` computes, which `acc.commands.estimate` uses).
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import sys
from typing import Any, Iterable

import torch
from torch import nn

from acc.big_model.sizes import compute_module_sizes, largest_unit
from acc.errors import AccError, did_you_mean
from acc.runtime.empty_weights import init_empty_weights

DTYPES = (("float32", 4), ("float16/bfloat16", 2), ("int8", 1))
FORMULA = ("training = weights + gradients + 2 Adam moments, each in the dtype: 4 x the parameters "
           "(activations not included; mixed precision with float32 master weights and moments needs "
           "16 bytes per parameter). int8 is for inference only.")

_IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def is_import_path(text: str) -> bool:
    """Whether `text` reads as `package.module:attribute` (a Hub repo id never holds a colon)."""
    return _IMPORT_PATH.fullmatch(text) is not None


def _value(text: str) -> Any:
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def parse_arguments(args: Iterable[str]) -> tuple[list[Any], dict[str, Any]]:
    """Factory arguments from the command line: Python literals (else strings), `key=value` for keywords."""
    positional: list[Any] = []
    keywords: dict[str, Any] = {}
    for arg in args:
        key, sep, value = arg.partition("=")
        if sep and key.isidentifier():
            keywords[key] = _value(value)
        elif keywords:
            raise AccError(f"positional argument {arg!r} follows a key=value argument")
        else:
            positional.append(_value(arg))
    return positional, keywords


def resolve(target: str) -> Any:
    """The object `package.module:attribute` names (modules in the current directory are found, as with
    `python -m`)."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise AccError(f"'{target}': give the model as package.module:factory or package.module:ClassName")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
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


def build_on_meta(target: str, obj: Any, args: list[Any], kwargs: dict[str, Any]) -> nn.Module:
    """`obj(*args, **kwargs)` under `init_empty_weights` (buffers on meta too, unless building needs them real);
    `obj` itself when it already is a module."""
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


def empty_model(target: str, args: Iterable[str] = ()) -> nn.Module:
    """The model `target` (`package.module:factory`) builds from the command-line `args`, on the meta device."""
    positional, keywords = parse_arguments(args)
    return build_on_meta(target, resolve(target), positional, keywords)


def memory_report(target: str, args: Iterable[str] = (), no_split: Iterable[str] = ()) -> dict[str, Any]:
    """acc's figures for `target`: parameters, buffers, the largest unit never split, and per dtype the bytes of
    the parameters, of training them with Adam and of the largest layer."""
    model = empty_model(target, args)
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


def _tensor_bytes(tensor: torch.Tensor) -> float:
    """A tensor's bytes in its own dtype, counted as Accelerate counts them (a bool is one bit)."""
    return tensor.numel() / 8 if tensor.dtype == torch.bool else tensor.numel() * tensor.element_size()


def calculate_maximum_sizes(model: nn.Module) -> tuple[float, tuple[float, list[str]]]:
    """Accelerate's figures: the bytes of every parameter and buffer in its own dtype (tied ones once, under their
    first name), and the largest layer (a module without children or of a class in `model._no_split_modules`,
    or a tensor of the model itself) as (bytes, the names of the layers of that size)."""
    sizes: dict[str, float] = {}
    for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
        parts = name.split(".")
        for i in range(len(parts) + 1):
            prefix = ".".join(parts[:i])
            sizes[prefix] = sizes.get(prefix, 0) + _tensor_bytes(tensor)
    no_split = list(getattr(model, "_no_split_modules", None) or [])
    pending: list[tuple[str, Any]] = [*model.named_parameters(recurse=False), *model.named_children(),
                                      *model.named_buffers(recurse=False)]
    best: float = 0
    names: list[str] = []
    while pending:
        name, item = pending.pop(0)
        children = list(item.named_children()) if isinstance(item, nn.Module) else []
        if not children or type(item).__name__ in no_split:
            size = sizes.get(name, 0)
            if size > best:
                best, names = size, [name]
            elif size == best:
                names.append(name)
        else:
            pending = [(f"{name}.{child}", module) for child, module in children] + pending
    return sizes.get("", 0), (best, names)


__all__ = ["DTYPES", "FORMULA", "build_on_meta", "calculate_maximum_sizes", "empty_model", "is_import_path",
           "memory_report", "parse_arguments", "resolve"]
