"""Reports how this worker's allocator treats freed tensors: RSS before, with and after 96 MiB of 1 MiB tensors
(touched, then freed while a small tensor allocated after them lives), transparent huge pages behind a touched 128 MiB tensor, and the allocator variables it
started with. Writes OUT/rank<N>.json; `measure()` is what acc.launch runs."""

import json
import os
import sys
from pathlib import Path

import torch


def field(path: str, name: str) -> int:
    for line in open(path):
        if line.startswith(name + ":"):
            return int(line.split()[1])  # kB
    return -1


def measure() -> dict:
    """The figures, in kB (also what acc.launch(measure) returns from each worker)."""
    torch.ones(1 << 18).sum()  # one 1 MiB block freed first: glibc's own threshold would rise above it
    before = field("/proc/self/status", "VmRSS")
    blocks = [torch.ones(1 << 18) for _ in range(96)]
    pin = torch.ones(16)  # a small block after them: the heap's top cannot be trimmed past it
    held = field("/proc/self/status", "VmRSS")
    del blocks
    after = field("/proc/self/status", "VmRSS")
    del pin
    huge_before = field("/proc/self/smaps_rollup", "AnonHugePages")
    big = torch.ones(1 << 25)  # 128 MiB: more than the 96 MiB freed above, so no freed block can hold it
    huge_with = field("/proc/self/smaps_rollup", "AnonHugePages")
    del big
    return {"held_kb": held - before, "released_kb": held - after, "huge_kb": huge_with - huge_before,
            "env": {k: os.environ.get(k) for k in ("MALLOC_MMAP_THRESHOLD_", "GLIBC_TUNABLES")}}


def main() -> None:
    out = Path(sys.argv[sys.argv.index("--out") + 1])
    out.mkdir(parents=True, exist_ok=True)
    (out / f"rank{os.environ.get('RANK', '0')}.json").write_text(json.dumps(measure()))


if __name__ == "__main__":
    main()
