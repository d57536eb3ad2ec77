"""Run the benchmarks and write bench/results/results.{json,md}.

    .venv/bin/python bench/run.py [--repeats N] [--only NAME ...]

Every figure is a ratio against a baseline measured in the same run, alternating the two.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from common import ROOT, machine  # noqa: E402

BENCHMARKS = ["cli_startup", "launch_ready", "ddp_step", "precision_step", "checkpoint_io", "sharded"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", nargs="*", choices=BENCHMARKS)
    args = parser.parse_args()
    results, started = [], time.time()
    for name in args.only or BENCHMARKS:
        print(f"== {name}", flush=True)
        for result in importlib.import_module(name).run(args.repeats):
            print(f"   {result.contender}: {result.value:.4g} {result.unit} vs {result.baseline}: "
                  f"{result.baseline_value:.4g} -> ratio {result.ratio:.3f}", flush=True)
            results.append(result)
    info = machine()
    info["wall_s"] = round(time.time() - started, 1)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"machine": info, "results": [r.as_dict() for r in results]},
                                                 indent=2) + "\n")
    lines = [f"Measured {info['date']} on {info['machine']}; python {info['python']}, torch {info['torch']}, "
             f"acc {info['acc']}; each value the median of {args.repeats} alternating runs.", "",
             "| benchmark | contender | baseline | contender | baseline | ratio |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.benchmark} | {r.contender} | {r.baseline} | {r.value:.4g} {r.unit} | "
                     f"{r.baseline_value:.4g} {r.unit} | **{r.ratio:.2f}** |")
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
