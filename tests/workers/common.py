"""Helpers for worker scripts: every rank writes what it saw to OUT/rank<N>.json for the test to read."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # make `tests.workers` importable from a script


def dump(out_dir: str, rank: int, payload: dict) -> None:
    path = Path(out_dir) / f"rank{rank}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(payload))
    os.replace(tmp, path)
