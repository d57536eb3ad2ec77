"""Behaves like a plain script: __name__, __file__, a sibling import, sys.argv, sys.path[0], torch's thread count."""

import json
import os
import sys

import sibling  # a module next to this script
import torch

from acc import Accelerator


def main() -> None:
    acc = Accelerator()
    out = sys.argv[sys.argv.index("--out") + 1]
    facts = {
        "name": __name__, "file": os.path.abspath(__file__), "argv": sys.argv, "sibling": sibling.VALUE,
        "path0": os.path.abspath(sys.path[0]), "rank": acc.process_index, "world": acc.num_processes,
        "main_module": sys.modules["__main__"].__dict__.get("__file__"),
        "threads": torch.get_num_threads(), "omp": os.environ.get("OMP_NUM_THREADS"),
    }
    with open(os.path.join(out, f"rank{acc.process_index}.json"), "w") as fp:
        json.dump(facts, fp)
    acc.end_training()


if __name__ == "__main__":
    main()
