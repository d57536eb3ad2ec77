"""The long chaos soak (by hand; not part of bench/run.py): many restarted runs, each with several SIGKILLs.

    .venv/bin/python bench/soak.py [--runs N] [--kills R] [--backends ddp fsdp] [--seed S] [--steps N]
                                   [--workers W] [--name soak]

Each run is tests/workers/chaos.py on 2 processes with exact resume, a checkpoint every 3 steps, total_limit 2 and
--max-restarts R; the controller (tests/integration/chaos.py) SIGKILLs a worker R times: at random, inside
save_state and inside load_state (each run has at least one of each when R >= 3). Every run must end with every
rank's weights and Adam state bitwise equal to an uninterrupted run's and the same per-step sample ids. Writes
bench/results/<name>.{json,md} (soak.md: no loader workers; soak-workers.md: --workers 2): runs, kills survived (inside save / inside load), bytes compared, wall time.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from tests.integration.chaos import chaos_run  # noqa: E402

RESULTS = ROOT / "bench" / "results"


def plan(rng: random.Random, kills: int) -> list[str]:
    kinds = ["random"] + (["save", "load"] if kills >= 3 else [])
    kinds += [rng.choice(["random", "save", "load"]) for _ in range(kills - len(kinds))]
    first, rest = kinds[0], kinds[1:]
    rng.shuffle(rest)
    return [first] + rest[:kills - 1]  # the first attempt has nothing to load: never a load kill first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=10, help="runs per backend")
    parser.add_argument("--kills", type=int, default=5, help="SIGKILLs per run (= --max-restarts)")
    parser.add_argument("--backends", nargs="*", default=["ddp", "fsdp"])
    parser.add_argument("--seed", type=int, default=2024)
    parser.add_argument("--steps", type=int, default=36)
    parser.add_argument("--workers", type=int, default=0, help="DataLoader worker processes per rank")
    parser.add_argument("--name", default="soak", help="bench/results/NAME.{json,md}")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    started = time.time()
    rows, failures = [], []
    with tempfile.TemporaryDirectory(prefix="acc-soak-") as tmp:
        for backend in args.backends:
            totals = {"backend": backend, "runs": 0, "kills": 0, "inside_save": 0, "inside_load": 0, "attempts": 0,
                      "bytes_compared": 0, "steps": 0, "bitwise_equal_runs": 0, "seconds": 0.0}
            for i in range(args.runs):
                kinds = plan(rng, args.kills)
                seed = rng.randrange(2**31)
                outcome = chaos_run(Path(tmp), backend, kinds, seed=seed, name=f"soak{i}", steps=args.steps,
                                    script=("--workers", str(args.workers)) if args.workers else ())
                killed = [k for k in outcome.kills if "missed" not in k]
                totals["runs"] += 1
                totals["kills"] += len(killed)
                totals["inside_save"] += sum(1 for k in killed if k["kind"] == "save" and k.get("inside"))
                totals["inside_load"] += sum(1 for k in killed if k["kind"] == "load" and k.get("inside"))
                totals["attempts"] += outcome.attempts
                totals["bytes_compared"] += outcome.bytes_compared
                totals["steps"] += outcome.steps
                totals["seconds"] += outcome.seconds
                ok = not outcome.problems
                totals["bitwise_equal_runs"] += ok
                print(f"{backend} run {i + 1}/{args.runs}: kills {[k['kind'] for k in killed]}, "
                      f"{outcome.attempts} attempts, {outcome.seconds:.0f} s: "
                      f"{'bitwise equal' if ok else 'PROBLEMS'}", flush=True)
                if not ok:
                    failures.append({"backend": backend, "run": i, "seed": seed, "kills": outcome.kills,
                                     "problems": outcome.problems})
                    print("\n".join(outcome.problems), flush=True)
            rows.append(totals)
    wall = time.time() - started
    RESULTS.mkdir(parents=True, exist_ok=True)
    meta = {"date": time.strftime("%Y-%m-%d"), "machine": f"{platform.machine()}, {platform.node()}",
            "python": platform.python_version(), "seconds": round(wall), "args": vars(args)}
    (RESULTS / f"{args.name}.json").write_text(json.dumps({"meta": meta, "rows": rows, "failures": failures}, indent=1))
    lines = [f"Chaos soak {meta['date']}: {args.kills} SIGKILLs per run, {args.steps} steps, checkpoint every 3 "
             f"steps, total_limit 2, 2 processes, exact resume, {args.workers} DataLoader workers per rank; "
             f"{round(wall)} s in all.", "",
             "| backend | runs | kills survived | of them inside save_state / load_state | attempts | bytes compared "
             "| runs bitwise equal |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['backend']} | {r['runs']} | {r['kills']} | {r['inside_save']} / {r['inside_load']} | "
                     f"{r['attempts']} | {r['bytes_compared']} | {r['bitwise_equal_runs']} of {r['runs']} |")
    (RESULTS / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
