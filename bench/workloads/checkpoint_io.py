"""save_state/load_state of a ~100 MB model (+ AdamW state) vs torch.save/torch.load of the same state dicts,
alternating in one process (checkpoint_common.py); prints medians as one BENCH line."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from checkpoint_common import build, first_step, time_against_torch  # noqa: E402

from acc import Accelerator  # noqa: E402


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    accelerator = Accelerator()
    model, opt = accelerator.prepare(*build())
    first_step(model, opt)
    time_against_torch(model, opt, accelerator.save_state, accelerator.load_state, repeats, "acc")


if __name__ == "__main__":
    main()
