"""What a tracker can store: scalars from numbers, one-element tensors and numpy scalars; hyper-parameters converted
to the types a tracker stores, saying so; values a tracker cannot store named once. Shared by the built-in tracker
and the tracker plugins (re-exported by acc.tracking). Torch-free (tensors are recognised by their methods).
"""

from __future__ import annotations

import enum
import json
from typing import Any, Mapping

NOT_SCALAR: Any = type("NotScalar", (), {"__repr__": lambda self: "<not a scalar>"})()
_PLAIN = (float, int, bool, str)


def scalar(value: Any) -> Any:
    """`value` as an int, float, bool or str: as it is, or the number in a one-element tensor / numpy scalar;
    NOT_SCALAR for anything else (None, lists, many-element tensors, images, objects)."""
    if type(value) in _PLAIN:
        return value
    if isinstance(value, _PLAIN):  # subclasses: numpy.float64, IntEnum, ...
        return value.value if isinstance(value, enum.Enum) else value
    item = getattr(value, "item", None)
    if callable(item):
        numel = getattr(value, "numel", None)
        count = numel() if callable(numel) else getattr(value, "size", None)
        if count == 1:
            try:
                result = item()
            except Exception:  # noqa: BLE001 - not a number after all
                return NOT_SCALAR
            return result if isinstance(result, _PLAIN) else NOT_SCALAR
    return NOT_SCALAR


def describe(value: Any) -> str:
    """A short description of a value for messages: 'a Tensor of shape (3, 4)', 'a list of 2 items', 'None'."""
    if value is None:
        return "None"
    shape = getattr(value, "shape", None)
    if shape is not None and not callable(shape):
        try:
            return f"a {type(value).__name__} of shape {tuple(shape)}"
        except TypeError:
            pass
    if isinstance(value, (list, tuple, set, frozenset, dict)):
        return f"a {type(value).__name__} of {len(value)} item{'s' if len(value) != 1 else ''}"
    return f"a {type(value).__name__}"


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _json_like(value: Any) -> bool:
    if value is None or type(value) in _PLAIN:
        return True
    if isinstance(value, (list, tuple)):
        return all(_json_like(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _json_like(v) for k, v in value.items())
    return False


def as_text(value: Any) -> str:
    """A value that is not a scalar, as a string: JSON for lists and dicts (when it can), str() otherwise."""
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, (list, tuple, dict)):
        try:
            return json.dumps(value, default=str)
        except (TypeError, ValueError):
            pass
    return str(value)


def hyperparameters(values: Mapping[str, Any], tracker: str, json_like: bool = False, say: Any = None) -> dict[str, Any]:
    """`values` with every value the tracker cannot store converted, and one line saying which and to what.

    A tracker stores int, float, bool and str (one-element tensors and numpy scalars become their number); with
    `json_like` also None, lists and dicts of those. Everything else becomes a string (JSON for containers)."""
    out: dict[str, Any] = {}
    converted: list[str] = []
    for key, value in values.items():
        key = str(key)
        number = scalar(value)
        if number is not NOT_SCALAR:
            out[key] = number
        elif json_like and _json_like(value):
            out[key] = list(value) if isinstance(value, tuple) else value
        else:
            out[key] = as_text(value)
            converted.append(f"{key} ({describe(value)}) -> {_short(repr(out[key]))}")
    if converted:
        stores = "numbers, booleans, strings, None, lists and dicts" if json_like else "numbers, booleans and strings"
        (say or _say)(f"tracker '{tracker}' stores hyper-parameters as {stores}; converted to strings: "
                      + "; ".join(converted))
    return out


def _say(message: str) -> None:
    from acc.tracking.base import say

    say(message)


class Unstorable:
    """Says once per key what a tracker cannot store in `log` (and that it left the value out)."""

    def __init__(self, tracker: str, stores: str):
        self.tracker, self.stores = tracker, stores
        self._seen: set[str] = set()

    def __call__(self, key: str, value: Any) -> None:
        if key in self._seen:
            return
        self._seen.add(key)
        _say(f"tracker '{self.tracker}' cannot store '{key}' ({describe(value)}): it stores {self.stores}; "
             "left out (said once per name)")


def split_values(values: Mapping[str, Any], unstorable: Unstorable, keep_text: bool = True) -> tuple[dict[str, Any], dict[str, Any]]:
    """(numbers, texts) of one `log` call: scalars by name, a dict of scalars flattened to 'name/key', strings
    apart (dropped and said when the tracker does not keep text), anything else said and left out."""
    numbers: dict[str, Any] = {}
    texts: dict[str, Any] = {}
    for key, value in values.items():
        if type(value) is float or type(value) is int:
            numbers[key] = value
            continue
        key = str(key)
        if isinstance(value, Mapping):
            for sub, inner in value.items():
                number = scalar(inner)
                if number is NOT_SCALAR or isinstance(number, str):
                    unstorable(f"{key}/{sub}", inner)
                else:
                    numbers[f"{key}/{sub}"] = number
            continue
        number = scalar(value)
        if isinstance(number, str):
            if keep_text:
                texts[key] = number
            else:
                unstorable(key, value)
        elif number is NOT_SCALAR:
            unstorable(key, value)
        else:
            numbers[key] = number
    return numbers, texts


__all__ = ["NOT_SCALAR", "Unstorable", "as_text", "describe", "hyperparameters", "scalar", "split_values"]
