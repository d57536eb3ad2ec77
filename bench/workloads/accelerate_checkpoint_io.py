"""The same checkpoint workload under Hugging Face Accelerate (cpu=True): its save_state/load_state vs
torch.save/torch.load of the same state dicts (checkpoint_common.py)."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from accelerate import Accelerator  # noqa: E402
from checkpoint_common import build, first_step, time_against_torch  # noqa: E402


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    accelerator = Accelerator(cpu=True)
    model, opt = accelerator.prepare(*build())
    first_step(model, opt)
    time_against_torch(model, opt, accelerator.save_state, accelerator.load_state, repeats, "accelerate")


if __name__ == "__main__":
    main()
