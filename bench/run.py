"""Run the benchmarks and write bench/results/results.{json,md}.

    .venv/bin/python bench/run.py [--repeats N] [--only NAME ... [--merge]]
    .venv/bin/python bench/run.py --quick      # issue 42's table: sharded defaults and compile, under 10 minutes

Every figure is a ratio against a baseline measured in the same run, alternating the two. --quick writes
bench/results/quick.{json,md} (the docs' benchmarks page shows both tables).
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import ROOT, Result, machine  # noqa: E402

# name -> repeats (alternating pairs) that fit the whole run in well under 15 minutes on 2 cores
BENCHMARKS = {"cli_startup": 5, "launch_ready": 5, "launch_python": 5, "ddp_step": 7, "gather": 3, "precision_step": 3,
              "compile_step": 5, "checkpoint_io": 3, "sharded": 1, "sharded_floor": 3,
              "scaling": 1, "mesh": 1, "big_model": 3, "from_pretrained": 3, "tracking_log": 5, "defaults": 3}
# --quick: the goals of the sharded-defaults issue, each row a ratio against its baseline of the same run
QUICK = {"defaults": 3, "compile_step": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="override every benchmark's repeats")
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS))
    parser.add_argument("--merge", action="store_true",
                        help="with --only: replace those benchmarks' rows in the existing results, keep the others "
                             "(the table then says which rows were measured later)")
    parser.add_argument("--quick", action="store_true",
                        help=f"only {', '.join(QUICK)} (sharded training with the defaults, torch.compile on the "
                             "CPU), written to bench/results/quick.{json,md}")
    args = parser.parse_args()
    if args.merge and not args.only:
        parser.error("--merge replaces the rows of the benchmarks --only names; give --only NAME ...")
    if args.quick and (args.only or args.merge):
        parser.error("--quick runs its own set of benchmarks; leave out --only and --merge")
    out = ROOT / "bench" / "results"
    kept, kept_at, kept_failures, info = _kept(out / "results.json", args.only) if args.merge else ([], None, [], {})
    rows, failures, started = [], [], time.time()
    plan = QUICK if args.quick else {name: BENCHMARKS[name] for name in args.only or BENCHMARKS}
    for name, repeats in plan.items():
        print(f"== {name}", flush=True)
        try:
            measured = importlib.import_module(name).run(args.repeats or repeats)
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not lose the others' figures
            print(f"   FAILED: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)
            failures.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        for result in measured:
            print(f"   {result.contender}: {result.value:.4g} {result.unit} vs {result.baseline}: "
                  f"{result.baseline_value:.4g} -> ratio {result.ratio:.3f}", flush=True)
            rows.append(result.as_dict() | {"bench": name})
    now = machine()
    now["wall_s"] = round(time.time() - started, 1)
    if args.merge:
        now["merged_at"] = time.strftime("%Y-%m-%d %H:%M")
        info = {**info, "merged": [*info.get("merged", []), {"benchmarks": args.only, **now}]}
        at = kept_at if kept_at is not None else len(kept)  # the rerun rows where the replaced ones stood
        rows, failures = kept[:at] + rows + kept[at:], kept_failures + failures
    else:
        info = now
    print(write(out, info, rows, failures, "quick" if args.quick else "results"))
    if failures:
        raise SystemExit(1)


def write(out: Path, info: dict, rows: list[dict], failures: list[str], stem: str = "results") -> str:
    """Write <stem>.json and <stem>.md under `out`; returns the table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{stem}.json").write_text(json.dumps({"machine": info, "results": rows, "failures": failures},
                                                 indent=2) + "\n")
    lines = [f"Measured {info['date']} on {info['machine']}; python {info['python']}, torch {info['torch']}, "
             f"acc {info['acc']}; whole run {info['wall_s']:.0f} s. Each value is the median of the runs shown "
             "(contender and baseline alternating); ratio = contender / baseline."]
    lines += [f"Rerun alone later ({m['merged_at']}, {m['wall_s']:.0f} s), rows of: {', '.join(m['benchmarks'])}."
              for m in info.get("merged", [])]
    notes = stem == "quick"  # a short table: each row also says its workload
    head = "| benchmark | contender | baseline | contender | baseline | runs | ratio |"
    lines += ["", head + (" workload |" if notes else ""), "|---|---|---|---|---|---|---|" + ("---|" if notes else "")]
    for r in (Result(**{k: v for k, v in row.items() if k not in ("ratio", "bench")}) for row in rows):
        lines.append(f"| {r.benchmark} | {r.contender} | {r.baseline} | {r.value:.4g} {r.unit} | "
                     f"{r.baseline_value:.4g} {r.unit} | {r.repeats} | **{r.ratio:.2f}** |"
                     + (f" {r.note} |" if notes else ""))
    lines += [f"\nFAILED {f}" for f in failures]
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    return "\n".join(lines)


def _kept(path: Path, replaced: list[str]) -> tuple[list[dict], int | None, list[str], dict]:
    """The rows of an earlier run less those of the `replaced` benchmarks, where the first replaced row stood
    (None: none), its failures less the replaced ones, and its machine facts."""
    if not path.is_file():
        raise SystemExit(f"--merge: no earlier results at {path}; run the whole bench first")
    earlier = json.loads(path.read_text())
    rows = [row for row in earlier["results"] if row.get("bench") not in replaced]
    at = next((i for i, row in enumerate(earlier["results"]) if row.get("bench") in replaced), None)
    failures = [f for f in earlier.get("failures", []) if f.split(":", 1)[0] not in replaced]
    return rows, at, failures, earlier["machine"]


if __name__ == "__main__":
    main()
