"""The drop-in lane's venvs (scripts/dropin-venv.sh): transformers on acc's `accelerate` drop-in, and the same pins
on Hugging Face Accelerate 1.15. Built once per machine and cached under ~/.cache/acc; a failed build fails these
tests, never skips them.

Accelerate's side of each comparison is kept in the cache too (`kept_reference`): its outcome depends only on its
venv (whose path holds its pins' hash), the script's text and the arguments, so a later session reads it instead of
running Accelerate again; ACC_FRESH_REFERENCE=1 runs it anew."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _venv(which: str) -> Path:
    proc = subprocess.run([str(ROOT / "scripts" / "dropin-venv.sh"), which], capture_output=True, text=True,
                          timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"scripts/dropin-venv.sh {which} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return Path(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def dropin_python() -> Path:
    return _venv("acc")


@pytest.fixture(scope="session")
def accelerate_python() -> Path:
    return _venv("accelerate")


def kept_reference(python: Path, script: Path, args: tuple, produce: Callable[[], Any]) -> Any:
    """`produce()` (a run on Hugging Face Accelerate's venv `python`, JSON-serialisable), or the result an earlier
    call with the same venv, script text and `args` kept under ~/.cache/acc/dropin-reference/."""
    home = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    cache = Path(os.environ.get("ACC_CACHE") or home / "acc")
    key = hashlib.sha256(json.dumps([str(Path(python).absolute()), hashlib.sha256(script.read_bytes()).hexdigest(),
                                     [str(a) for a in args]]).encode()).hexdigest()[:20]
    path = cache / "dropin-reference" / f"{script.stem}-{key}.json"
    if path.is_file() and os.environ.get("ACC_FRESH_REFERENCE") != "1":
        return json.loads(path.read_text())
    result = produce()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result))
    tmp.replace(path)
    return result
