"""`acc.utils.tqdm`: tqdm's progress bar shown by the local main process only (Accelerate's
`accelerate.utils.tqdm`). Kept out of a module named `tqdm`, which would shadow the function."""

from __future__ import annotations

import os
from typing import Any

from acc.utils.imports import is_tqdm_available


def tqdm(*args: Any, main_process_only: bool = True, **kwargs: Any) -> Any:
    """`tqdm.auto.tqdm(*args, **kwargs)`, disabled on every process but the local main one (LOCAL_RANK 0)
    unless `main_process_only=False`; `disable=True` still disables it everywhere."""
    if not is_tqdm_available():
        raise ImportError("acc's `tqdm` requires `tqdm` to be installed. Please run `pip install tqdm`.")
    if args and isinstance(args[0], bool):
        raise ValueError("Passing `True` or `False` as the first argument to acc's `tqdm` wrapper is unsupported. "
                         "Please use the `main_process_only` keyword argument instead.")
    from tqdm.auto import tqdm as _tqdm

    disable = kwargs.pop("disable", False)
    if main_process_only and not disable:
        local_rank = int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))
        disable = local_rank != 0
    return _tqdm(*args, **kwargs, disable=disable)


__all__ = ["tqdm"]
