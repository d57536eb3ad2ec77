"""`acc.get_logger`: a logger that logs once (on the main process) unless asked otherwise."""

from __future__ import annotations

import logging
import os
from typing import Any


class MultiProcessAdapter(logging.LoggerAdapter):
    """Logs on the main process only; pass `main_process_only=False` to log on every process (prefixed
    with the rank), `in_order=True` is not offered: ordering across processes needs a barrier per call."""

    def log(self, level: int, msg: Any, *args: Any, main_process_only: bool = True, **kwargs: Any) -> None:
        rank = int(os.environ.get("RANK", "0"))
        if main_process_only and rank != 0:
            return
        if not self.isEnabledFor(level):
            return
        if not main_process_only:
            msg = f"[rank {rank}] {msg}"
        # the record names the caller's file and line: one frame above this adapter (logging's own are skipped);
        # a stacklevel the caller gives counts from this adapter, as in Accelerate
        kwargs.setdefault("stacklevel", 2)
        self.logger.log(level, msg, *args, **kwargs)


def get_logger(name: str, log_level: str | int | None = None) -> MultiProcessAdapter:
    """A logger for `name` that logs on the main process only (level from `log_level` or ACC_LOG_LEVEL)."""
    logger = logging.getLogger(name)
    level = log_level or os.environ.get("ACC_LOG_LEVEL")
    if level is not None:
        logger.setLevel(level.upper() if isinstance(level, str) else level)
    return MultiProcessAdapter(logger, {})
