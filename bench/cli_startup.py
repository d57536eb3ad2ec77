"""CLI start-up: `acc --help`, `acc plugins`, `acc launch --dry-run` against `torchrun --help`."""

from __future__ import annotations

import shutil

from common import ACC, BIN, PEER_BIN, ROOT, Result, alternate, env_for_bench, wall


def run(repeats: int) -> list[Result]:
    env = env_for_bench()
    torchrun = [str(BIN / "torchrun"), "--help"]
    example = str(ROOT / "examples" / "quickstart.py")
    results = []
    for label, cmd in (
        ("acc --help", [ACC, "--help"]),
        ("acc plugins", [ACC, "plugins"]),
        ("acc launch --dry-run (ddp, 2 processes)", [ACC, "launch", "--backend", "ddp", "--nproc", "2", "--dry-run",
                                                      example]),
    ):
        value, base = alternate(lambda: wall(cmd, env), lambda: wall(torchrun, env), repeats)
        results.append(Result("cli start-up", label, "torchrun --help", value, base, "s", repeats))
    accelerate = shutil.which("accelerate", path=str(PEER_BIN))
    if accelerate:
        value, base = alternate(lambda: wall([ACC, "--help"], env), lambda: wall([accelerate, "--help"], env), repeats)
        results.append(Result("cli start-up", "acc --help", "accelerate --help", value, base, "s", repeats))
    return results
