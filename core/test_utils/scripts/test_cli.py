"""The script Accelerate's CLI tests launch: acc's version of Accelerate's test_utils/scripts/test_cli.py.

    acc launch PATH/test_cli.py            # with any config file or flags under test

It asks torch how many accelerators this process sees (CUDA GPUs, else Intel XPUs) and prints
"Successfully ran on N GPUs" (or XPUs). It starts no run of its own, so a launch under test only has to start it:
what it checks is that `acc launch` runs the script to the end (exit code 0).
"""

from __future__ import annotations

import torch

from acc.utils.imports import is_xpu_available


def main() -> None:
    kind, count = "GPU", 0
    if torch.cuda.is_available():
        count = torch.cuda.device_count()
    elif is_xpu_available():
        kind, count = "XPU", torch.xpu.device_count()
    print(f"Successfully ran on {count} {kind}s")


if __name__ == "__main__":
    main()
