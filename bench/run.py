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

# name -> repeats (alternating pairs) that fit the whole run in well under 15 minutes on 2 cores
BENCHMARKS = {"cli_startup": 5, "launch_ready": 5, "launch_python": 5, "ddp_step": 7, "gather": 3, "precision_step": 3,
              "compile_step": 5, "checkpoint_io": 3, "sharded": 1, "sharded_floor": 3,
              "scaling": 1, "big_model": 3, "tracking_log": 5}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=None, help="override every benchmark's repeats")
    parser.add_argument("--only", nargs="*", choices=list(BENCHMARKS))
    args = parser.parse_args()
    results, failures, started = [], [], time.time()
    for name in args.only or BENCHMARKS:
        print(f"== {name}", flush=True)
        try:
            measured = importlib.import_module(name).run(args.repeats or BENCHMARKS[name])
        except Exception as exc:  # noqa: BLE001 - one broken benchmark must not lose the others' figures
            print(f"   FAILED: {type(exc).__name__}: {str(exc)[-2000:]}", flush=True)
            failures.append(f"{name}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
            continue
        for result in measured:
            print(f"   {result.contender}: {result.value:.4g} {result.unit} vs {result.baseline}: "
                  f"{result.baseline_value:.4g} -> ratio {result.ratio:.3f}", flush=True)
            results.append(result)
    info = machine()
    info["wall_s"] = round(time.time() - started, 1)
    out = ROOT / "bench" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"machine": info, "results": [r.as_dict() for r in results],
                                                  "failures": failures}, indent=2) + "\n")
    lines = [f"Measured {info['date']} on {info['machine']}; python {info['python']}, torch {info['torch']}, "
             f"acc {info['acc']}; whole run {info['wall_s']:.0f} s. Each value is the median of the runs shown "
             "(contender and baseline alternating); ratio = contender / baseline.", "",
             "| benchmark | contender | baseline | contender | baseline | runs | ratio |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.benchmark} | {r.contender} | {r.baseline} | {r.value:.4g} {r.unit} | "
                     f"{r.baseline_value:.4g} {r.unit} | {r.repeats} | **{r.ratio:.2f}** |")
    lines += [f"\nFAILED {f}" for f in failures]
    (out / "results.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if failures:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
