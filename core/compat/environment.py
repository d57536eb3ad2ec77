"""Environment-variable helpers, as Accelerate spells them (public path `acc.utils.environment`). Torch-free."""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator


def str_to_bool(value: str, to_bool: bool = False) -> int | bool:
    """1 (True with `to_bool`) for y, yes, t, true, on, 1; 0 (False) for n, no, f, false, off, 0; else ValueError."""
    value = value.lower()
    if value in ("y", "yes", "t", "true", "on", "1"):
        return True if to_bool else 1
    if value in ("n", "no", "f", "false", "off", "0"):
        return False if to_bool else 0
    raise ValueError(f"invalid truth value {value}")


def get_int_from_env(env_keys: list[str], default: int) -> int:
    """The first non-negative integer among the variables `env_keys`, else `default`."""
    for key in env_keys:
        value = int(os.environ.get(key, -1))
        if value >= 0:
            return value
    return default


def parse_flag_from_env(key: str, default: bool = False) -> bool:
    """Whether the variable `key` (default `default`) is a true value (see str_to_bool)."""
    return str_to_bool(os.environ.get(key, str(default))) == 1


def parse_choice_from_env(key: str, default: str = "no") -> str:
    return os.environ.get(key, str(default))


def are_libraries_initialized(*library_names: str) -> list[str]:
    """Those of `library_names` that are already imported."""
    return [name for name in library_names if name in sys.modules]


@contextlib.contextmanager
def clear_environment() -> Iterator[None]:
    """Run the block with an empty `os.environ`; the previous environment is back afterwards (variables set
    inside are dropped)."""
    saved = os.environ.copy()
    os.environ.clear()
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


@contextlib.contextmanager
def patch_environment(**kwargs: Any) -> Iterator[None]:
    """Set each keyword as an environment variable (name upper-cased, value `str()`-ed) for the block; afterwards
    each one has its previous value again, or is unset if it had none.

        with patch_environment(master_port=29501, omp_num_threads=1):
            ...
    """
    previous: dict[str, str] = {}
    for key, value in kwargs.items():
        key = key.upper()
        if key in os.environ:
            previous[key] = os.environ[key]
        os.environ[key] = str(value)
    try:
        yield
    finally:
        for key in kwargs:
            key = key.upper()
            if key in previous:
                os.environ[key] = previous[key]
            else:
                os.environ.pop(key, None)


_FORBIDDEN_IN_ENV = (";", "\n", "<", ">", " ")


def convert_dict_to_env_variables(current_env: dict[str, str]) -> list[str]:
    """`KEY=VALUE\n` lines for the entries of `current_env` that are safe to write into an environment file (no
    `;`, newline, `<`, `>` or space, neither side empty); the others are skipped with a warning naming them."""
    import logging

    out = []
    for key, value in current_env.items():
        if key and value and not any(c in key + value for c in _FORBIDDEN_IN_ENV):
            out.append(f"{key}={value}\n")
        else:
            # logged under the public path the function is imported from (acc.utils.environment)
            logging.getLogger("acc.utils.environment").warning(
                f"Skipping {key}={value}: it contains forbidden characters or is empty")
    return out


def purge_accelerate_environment(func_or_cls: Any) -> Any:
    """Decorator: the ACCELERATE_* environment variables a function (or each test method of a class, subclasses
    included) sets are removed after it, and the ones it changed are restored (transformers' TrainingArguments sets
    them)."""
    import functools

    def scrubbed(func: Any) -> Any:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            before = {k: v for k, v in os.environ.items() if k.startswith("ACCELERATE_")}
            try:
                return func(*args, **kwargs)
            finally:
                for key in [k for k in os.environ if k.startswith("ACCELERATE_")]:
                    if key in before:
                        os.environ[key] = before[key]
                    else:
                        del os.environ[key]

        wrapper._acc_purges_environment = True  # type: ignore[attr-defined]
        return wrapper

    if not isinstance(func_or_cls, type):
        return scrubbed(func_or_cls)

    def wrap_tests(cls: type) -> type:
        for name in dir(cls):
            method = getattr(cls, name)
            if name.startswith("test") and callable(method) and not getattr(method, "_acc_purges_environment", False):
                setattr(cls, name, scrubbed(method))
        return cls

    wrap_tests(func_or_cls)
    func_or_cls.__init_subclass__ = classmethod(lambda cls, **kw: wrap_tests(cls))  # type: ignore[assignment]
    return func_or_cls


__all__ = ["are_libraries_initialized", "convert_dict_to_env_variables", "purge_accelerate_environment", "clear_environment", "get_int_from_env", "parse_choice_from_env",
           "parse_flag_from_env", "patch_environment", "str_to_bool"]
