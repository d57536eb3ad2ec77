"""The built-in tracker `jsonl`: one JSON-lines file per run under the logging directory, no dependency; and the
reader `acc plot` uses. Torch-free.

    <logging_dir>/<project_name>/<run>.jsonl      run = <YYYYmmdd-HHMMSS>-<pid>[-<n>]

Each line is one JSON object with an "event":
    {"event": "run", "project": ..., "run": ..., "time": <unix s>, "acc": <version>, "pid": ...}     first line
    {"event": "config", "values": {...}}                                                             hyper-parameters
    {"event": "log", "step": <int or null>, "time": <unix s>, "values": {"loss": 0.25, ...}}        each log call
    {"event": "finish", "time": <unix s>}                                                            finish()
Non-finite floats are written as NaN / Infinity (Python's json reads them back). Log lines are written by the first
log call `flush_secs` (default 0.25 s; init_kwargs={"jsonl": {"flush_secs": 0}}: every call) after the previous
write, by `finish`, and when the script ends without end_training or with an exception; a process killed outright
(or a forked worker that fails, which ends with os._exit) loses what it logged since the last write.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator

from acc.tracking import GeneralTracker, on_main_process
from acc.tracking.values import Unstorable, hyperparameters, scalar, split_values

_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":")).encode
_NUMBERS = frozenset((int, float))


class JSONLinesTracker(GeneralTracker):
    """acc's built-in tracker (`log_with="jsonl"`): numbers and strings, one line per `log` call, one file per run.

    `get_tracker("jsonl", unwrap=True)` is the run file's path."""

    name = "jsonl"
    requires_logging_directory = True

    def __init__(self, run_name: str, logging_dir: str | os.PathLike, flush_secs: float = 0.25):
        super().__init__()
        self.flush_secs = float(flush_secs)
        self._flushed = 0.0
        self.run_name = str(run_name)
        self.logging_dir = Path(logging_dir)
        self.path: Path | None = None
        self._file: Any = None
        self._unstorable = Unstorable(self.name, "numbers, booleans, strings and dicts of numbers")
        self._keys: dict = {}  # value name -> its JSON spelling with the colon
        self._pending: list = []  # (values, step, time) of the log calls since the last flush

    @property
    def tracker(self) -> Path | None:
        return self.path

    @on_main_process
    def start(self) -> None:
        directory = self.logging_dir / self.run_name
        directory.mkdir(parents=True, exist_ok=True)
        stem = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}"
        for n in range(1000):
            path = directory / (f"{stem}.jsonl" if n == 0 else f"{stem}-{n}.jsonl")
            try:
                self._file = open(path, "x", encoding="utf-8")
            except FileExistsError:
                continue
            break
        else:  # pragma: no cover - a thousand runs started in one second by one process
            raise FileExistsError(f"no free run file name {stem}-N.jsonl in {directory}")
        self.path = path
        from acc.contract.version import __version__

        self._write({"event": "run", "project": self.run_name, "run": path.stem, "time": time.time(),
                     "acc": __version__, "pid": os.getpid()})

    def _write(self, record: dict) -> None:
        if self._file is None:
            raise RuntimeError("the jsonl tracker is not started (init_trackers starts it) or already finished")
        self._drain()
        self._file.write(_dumps(record) + "\n")
        self._file.flush()
        self._flushed = time.time()

    def _drain(self) -> None:
        """Write the log calls kept since the last flush (their values were all ints and floats: immutable)."""
        pending, self._pending = self._pending, []
        for values, step, when in pending:
            line = self._fast_line(values, step, when)
            self._file.write((line or _dumps({"event": "log", "step": step, "time": when, "values": values})) + "\n")

    @on_main_process
    def store_init_configuration(self, values: dict) -> None:
        self._write({"event": "config", "values": hyperparameters(values, self.name, json_like=True)})

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        # The per-step path. Not @on_main_process: the run file exists on the process that started it only. Values
        # that are all ints and floats (immutable) are kept as they are and written at the next flush, in one go:
        # encoding right after a training step, with the step's data in the caches, costs several times more.
        if self._file is None:
            return self._not_started()
        now = time.time()
        if _NUMBERS.issuperset(map(type, values.values())) and (step is None or type(step) is int):
            self._pending.append((dict(values), step, now))
        else:
            numbers, texts = split_values(values, self._unstorable)
            numbers.update(texts)
            if step is not None and type(step) is not int:
                step = scalar(step)
            self._pending.append((numbers, step, now))
        if now - self._flushed >= self.flush_secs:
            self.flush()

    def _fast_line(self, values: Any, step: Any, now: float) -> str | None:
        """The log line when every value is a finite float or an int and step an int or None (what json writes,
        without its generic machinery); None otherwise."""
        if step is not None and type(step) is not int:
            return None
        keys = self._keys
        parts = []
        for key, value in values.items():
            kind = type(value)
            if kind is float:
                if value - value != 0.0:  # nan, inf: json's own spelling
                    return None
                text = value.__repr__()
            elif kind is int:
                text = value.__repr__()
            else:
                return None
            name = keys.get(key)
            if name is None:
                if type(key) is not str:
                    return None
                name = keys[key] = _dumps(key) + ":"
            parts.append(name + text)
        return ('{"event":"log","step":' + ("null" if step is None else step.__repr__()) + ',"time":'
                + now.__repr__() + ',"values":{' + ",".join(parts) + "}}")

    def flush(self) -> None:
        """Write every log line kept so far to the file now."""
        if self._file is not None:
            self._drain()
            self._file.flush()
            self._flushed = time.time()

    def _not_started(self) -> None:
        from acc.tracking import _is_main_process

        if self.main_process_only and not _is_main_process():
            return None
        raise RuntimeError("the jsonl tracker is not started (init_trackers starts it) or already finished")

    @on_main_process
    def finish(self) -> None:
        if self._file is not None:
            self._write({"event": "finish", "time": time.time()})
            self._file.close()
            self._file = None


# ---------------------------------------------------------------------------------------------- reading
@dataclass
class Run:
    """One run file read back: its header, hyper-parameters and every numeric series (name -> [(step, value)])."""

    path: Path
    project: str = ""
    run: str = ""
    config: dict = field(default_factory=dict)
    series: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    finished: bool = False

    @property
    def label(self) -> str:
        return f"{self.project}/{self.run}" if self.project else self.path.stem


def read_run(path: str | os.PathLike) -> Run:
    """Parse one JSON-lines run file. A log call without a step is placed at its index among the log calls.
    Raises ValueError naming the file and line of a line that is not JSON (a last, partial line is ignored)."""
    path = Path(path)
    run = Run(path)
    lines = path.read_text(encoding="utf-8").splitlines()
    index = 0
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if number == len(lines):
                break  # a run killed while writing its last line
            raise ValueError(f"{path}:{number}: not a JSON line ({exc})") from None
        event = record.get("event") if isinstance(record, dict) else None
        if event == "run":
            run.project, run.run = str(record.get("project", "")), str(record.get("run", path.stem))
        elif event == "config":
            run.config = dict(record.get("values") or {})
        elif event == "log":
            step = record.get("step")
            x = step if isinstance(step, (int, float)) and not isinstance(step, bool) else index
            index += 1
            for name, value in (record.get("values") or {}).items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    run.series.setdefault(name, []).append((x, float(value)))
        elif event == "finish":
            run.finished = True
    return run


def is_run_file(path: Path) -> bool:
    """Whether `path` is a run file of the jsonl tracker (its first line is a run header)."""
    try:
        with open(path, encoding="utf-8") as fp:
            first = fp.readline()
        return json.loads(first).get("event") == "run"
    except (OSError, ValueError, AttributeError):
        return False


def find_runs(paths: Iterable[str | os.PathLike]) -> Iterator[Path]:
    """The run files named, or found under the directories named (recursively), each once, in order."""
    seen: set[Path] = set()
    for given in paths:
        given = Path(given)
        candidates = [given] if given.is_file() else sorted(given.rglob("*.jsonl"))
        for candidate in candidates:
            resolved = candidate.resolve()
            if resolved not in seen and is_run_file(candidate):
                seen.add(resolved)
                yield candidate


__all__ = ["JSONLinesTracker", "Run", "find_runs", "is_run_file", "read_run"]
