"""The chaos controller: SIGKILLs workers of a real `acc launch --max-restarts R` run and checks that the run still
ends exactly where an uninterrupted run ends (shared by tests/integration/test_chaos.py and bench/soak.py).

A run is `tests/workers/chaos.py` on two processes with exact resume (--resume-data-position), automatic
checkpoint naming with total_limit, a checkpoint every few steps. The controller follows the workers' event log
(OUT/events.jsonl) and, for each planned kill, SIGKILLs one worker of the current attempt:

- "random": a random rank, after a random number of steps of that attempt, after a random delay (0-50 ms);
- "save": a random rank while it is inside save_state (after it logged "save"; the main process sleeps inside
  the registered object's state_dict, so the checkpoint is never complete yet: checked afterwards);
- "load": a random rank while it is inside load_state (inside the registered object's load_state_dict).

Then it checks: the run exits 0; every rank's final weights and Adam state are bitwise equal (sha256 of the raw
bytes) to an uninterrupted run's; the surviving timeline (each rank's per-step sample ids, later attempts
replacing the steps they redid) equals the uninterrupted run's, step for step; a redone step trained the same
samples as the first time; at most total_limit checkpoints and no temporary directory are left; no worker
process is left.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from tests.waiting import wait_until

ROOT = Path(__file__).resolve().parents[2]
WORKER = ROOT / "tests" / "workers" / "chaos.py"
ACC = str(Path(sys.executable).parent / "acc")


@dataclass
class Outcome:
    kills: list[dict] = field(default_factory=list)  # what was killed, when, and where it was
    attempts: int = 0
    bytes_compared: int = 0
    steps: int = 0
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)


def environment(tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACC_", "TORCHELASTIC_"))
           and k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
    env["ACC_CONFIG_HOME"] = str(tmp / "user-config")
    return env


def command(backend: str, restarts: int, project: Path, out: Path, steps: int, save_every: int, total_limit: int,
            big_mb: int, pause: float, launch: tuple = (), script: tuple = ()) -> list[str]:
    return [ACC, "launch", "--backend", backend, "--nproc", "2", "--max-restarts", str(restarts),
            "--resume-data-position", *launch, str(WORKER), "--project", str(project), "--out", str(out), "--steps", str(steps),
            "--save-every", str(save_every), "--total-limit", str(total_limit), "--big-mb", str(big_mb),
            "--pause", str(pause), *script]


def read_events(out: Path) -> list[dict]:
    path = out / "events.jsonl"
    if not path.exists():
        return []
    events = []
    for line in path.read_text().splitlines():
        try:
            events.append(json.loads(line))
        except ValueError:  # a line cut short by a SIGKILL
            pass
    return events


def timeline(events: list[dict], rank: int) -> tuple[dict[int, list], list[str]]:
    """The surviving per-step sample ids of `rank` (an attempt that resumed at step s replaces steps >= s), and
    where a redone step trained other samples than the first time (should be none)."""
    kept: dict[int, list] = {}
    first: dict[int, list] = {}
    problems = []
    for e in events:
        if e["rank"] != rank:
            continue
        if e["event"] == "start":
            kept = {s: v for s, v in kept.items() if s < e["step"]}
        elif e["event"] == "step":
            kept[e["step"]] = e["idx"]
            if e["step"] in first and first[e["step"]] != e["idx"]:
                problems.append(f"rank {rank} step {e['step']}: attempt {e['attempt']} trained {e['idx']}, "
                                f"earlier {first[e['step']]}")
            first.setdefault(e["step"], e["idx"])
    return kept, problems


def leftover_processes(token: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmd = (entry / "cmdline").read_bytes().decode(errors="replace")
                state = (entry / "status").read_text()
            except OSError:
                continue
            if token in cmd and "zombie" not in state.lower():
                found.append(int(entry.name))
    return found


def _wait(predicate, proc: subprocess.Popen, out: Path, timeout: float) -> bool:
    """Whether `predicate` holds within `timeout` s, checked whenever a file in `out` (the event log's directory)
    changes; False as soon as the run ends first."""
    return wait_until(predicate, timeout, changes_in=[out], ended=[proc])


def reference(work: Path, backend: str, **run) -> Path:
    """An uninterrupted run (the same command, restarts allowed, none needed); its output directory."""
    tag = "-".join(a.strip("-") for a in (*run.get("launch", ()), *run.get("script", ())))
    out = work / f"straight-{backend}{'-' + tag if tag else ''}"
    if not (out / "final0.json").exists():
        proc = subprocess.run(command(backend, 1, Path(f"{out}-proj"), out, **run), cwd=work,
                              env=environment(work), capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise RuntimeError(f"the uninterrupted run failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return out


def chaos_run(work: Path, backend: str, kills: list[str], seed: int, name: str = "chaos", steps: int = 30,
              save_every: int = 3, total_limit: int = 2, big_mb: int = 8, pause: float = 0.4,
              timeout: float = 600, launch: tuple = (), script: tuple = ()) -> Outcome:
    """One run with the given kills (kinds: random, save, load), checked against an uninterrupted run; `launch`
    adds acc launch flags (e.g. --semantics acc) to both, `script` arguments of chaos.py (e.g. --workers 2)."""
    rng = random.Random(seed)
    run = dict(steps=steps, save_every=save_every, total_limit=total_limit, big_mb=big_mb, pause=pause,
               launch=tuple(launch), script=tuple(script))
    straight = reference(work, backend, **run)
    out, project = work / f"{name}-{backend}-{seed}", work / f"{name}-{backend}-{seed}-proj"
    outcome = Outcome()
    started = time.monotonic()
    proc = subprocess.Popen(command(backend, len(kills), project, out, **run), cwd=work, env=environment(work),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    if kills and kills[0] == "load":
        raise ValueError("the first attempt loads nothing: plan another kill first")
    try:
        attempt = 0
        for kind in kills:
            record = _kill_once(proc, out, project, attempt, kind, rng, steps, save_every)
            outcome.kills.append(record)
            attempt += "missed" not in record
        stdout, stderr = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    outcome.seconds = time.monotonic() - started
    events = read_events(out)
    outcome.attempts = 1 + max((e["attempt"] for e in events), default=0)
    if proc.returncode != 0:
        outcome.problems.append(f"the run exited {proc.returncode}:\n{stderr[-4000:]}")
        return outcome
    time.sleep(0.2)
    left = leftover_processes(str(out))
    if left:
        outcome.problems.append(f"processes left: {left}")
    for rank in (0, 1):
        ref = json.loads((straight / f"final{rank}.json").read_text())
        got = json.loads((out / f"final{rank}.json").read_text())
        for key in ("weights", "adam"):
            if got[key] != ref[key]:
                bad = [a[0] for a, b in zip(got[key], ref[key]) if a != b]
                outcome.problems.append(f"rank {rank}: {key} differ from the uninterrupted run's: {bad}")
            outcome.bytes_compared += sum(entry[2] for entry in ref[key])
        for key in ("lr", "steps", "applied", "rand"):
            if got[key] != ref[key]:
                outcome.problems.append(f"rank {rank}: {key} {got[key]} != {ref[key]} (uninterrupted)")
        survived, redone = timeline(events, rank)
        wanted, _ = timeline(read_events(straight), rank)
        outcome.problems += redone
        if survived != wanted:
            diff = [s for s in sorted(set(survived) | set(wanted)) if survived.get(s) != wanted.get(s)]
            outcome.problems.append(f"rank {rank}: the surviving timeline differs at steps {diff[:10]}")
        outcome.steps = max(outcome.steps, len(survived))
    names = sorted(p.name for p in (project / "checkpoints").iterdir() if not p.name.startswith("."))
    if len(names) > total_limit:
        outcome.problems.append(f"more checkpoints than total_limit {total_limit}: {names}")
    hidden = sorted(p.name for p in (project / "checkpoints").iterdir() if p.name.startswith("."))
    if hidden:  # what killed saves left is removed once a later checkpoint is published
        outcome.problems.append(f"temporary directories left behind: {hidden}")
    return outcome


def _kill_once(proc: subprocess.Popen, out: Path, project: Path, attempt: int, kind: str, rng: random.Random,
               steps: int, save_every: int) -> dict:
    """Kill one worker of `attempt` as `kind` says; returns what was done. Waits for the next attempt's start."""
    def events_of(name: str) -> list[dict]:
        return [e for e in read_events(out) if e["attempt"] == attempt and e["event"] == name]

    victim_rank = rng.randrange(2)
    record = {"attempt": attempt, "kind": kind, "rank": victim_rank}
    if kind == "load":
        # inside load_state: the victim is in the registered object's load_state_dict (attempt 0 has nothing to
        # load: it is first killed at random so that the next attempt loads)
        if not _wait(lambda: events_of("in-load") and any(e["rank"] == victim_rank for e in events_of("in-load"))
                     or events_of("start"), proc, out, 300):
            return {**record, "missed": "the run ended first"}
        inside = [e for e in events_of("in-load") if e["rank"] == victim_rank]
        if not inside:
            return {**record, "missed": "this attempt loaded nothing"}
        time.sleep(rng.uniform(0, 0.1))
        victim = inside[0]
    elif kind == "save":
        # inside save_state: after the victim logged "save", while the main process is still in it
        def in_save():  # a save after a complete one (so that a previous checkpoint exists to resume from)
            if not any(e["event"] == "saved" for e in read_events(out)):
                return []
            done = {e["step"] for e in events_of("saved") if e["rank"] == victim_rank}
            return [e for e in events_of("save") if e["rank"] == victim_rank and e["step"] not in done
                    and any(s["event"] == "saved" and s["time"] < e["time"] for s in read_events(out))]
        if not _wait(lambda: bool(in_save()) and any(e["rank"] == 0 for e in events_of("in-save")
                                                     if e["step"] == in_save()[0]["step"]), proc, out, 300):
            return {**record, "missed": "the run ended first"}
        time.sleep(rng.uniform(0, 0.1))
        victim = in_save()[0]
    else:
        start = _first(lambda: events_of("start"), proc, out)
        if start is None:
            return {**record, "missed": "the run ended first"}
        at = min(steps - 1, start[0]["step"] + rng.randint(1, 2 * save_every))
        if not _wait(lambda: any(e["step"] >= at for e in events_of("step")), proc, out, 300):
            return {**record, "missed": "the run ended first"}
        time.sleep(rng.uniform(0, 0.05))
        victims = [e for e in events_of("start") if e["rank"] == victim_rank]
        victim = victims[0]
    pid = victim["pid"]
    record["pid"] = pid
    tmp_dirs = lambda: {p.name for p in (project / "checkpoints").glob(".*.tmp-*")} if (project / "checkpoints").exists() else set()  # noqa: E731
    before = {p.name for p in (project / "checkpoints").iterdir()} if (project / "checkpoints").exists() else set()
    try:
        os.kill(pid, signal.SIGKILL)
        record["killed_at"] = time.time()
    except ProcessLookupError:
        record["missed"] = "the process had ended"
    last = [e for e in read_events(out) if e["rank"] == victim_rank and e["attempt"] == attempt]
    record["last_event"] = last[-1]["event"] if last else None
    record["step"] = max((e["step"] for e in last if e["event"] == "step"), default=None)
    if kind == "save":  # it must have been killed inside: the checkpoint it was writing never completed
        step = victim["step"]
        record["inside"] = not any(e["event"] == "saved" and e["step"] == step for e in last)
        record["tmp_dirs"] = sorted(tmp_dirs())
    if kind == "load":
        record["inside"] = not any(e["event"] == "loaded" for e in last)
    record["checkpoints_before"] = sorted(before)
    _first(lambda: [e for e in read_events(out) if e["attempt"] == attempt + 1], proc, out)  # the next attempt
    return record


def _first(find, proc: subprocess.Popen, out: Path, timeout: float = 300):
    found = []
    _wait(lambda: found.extend(find()) or bool(found), proc, out, timeout)
    return found or None
