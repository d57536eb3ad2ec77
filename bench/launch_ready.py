"""Launch-to-ready of 2 processes (init + barrier + exit): acc launch (workers forked from a launcher that
imported torch once) vs torchrun, same script, alternating."""

from __future__ import annotations

from common import ACC, BIN, WORKLOADS, Result, alternate, env_for_bench, wall


def run(repeats: int) -> list[Result]:
    env = env_for_bench(OMP_NUM_THREADS="1")
    script = str(WORKLOADS / "ready.py")
    ours = [ACC, "launch", "--output-dir", "", "--backend", "ddp", "--nproc", "2", script]
    spawn = [*ours[:-1], "--start-method", "spawn", script]
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", script]
    value, base = alternate(lambda: wall(ours, env), lambda: wall(torchrun, env), repeats)
    spawned, base2 = alternate(lambda: wall(spawn, env), lambda: wall(torchrun, env), repeats)
    return [
        Result("launch to ready, 2 processes", "acc launch (fork, default)", "torchrun", value, base, "s", repeats),
        Result("launch to ready, 2 processes", "acc launch --start-method spawn", "torchrun", spawned, base2, "s",
               repeats),
    ]
