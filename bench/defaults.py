"""Sharded training with the defaults a user gets (issue 42's table): ddp, fsdp and ZeRO-3 on the ~200 MB bench
model, 2 processes, built inside `accelerator.init_module()`, no tuning flag.

Each round launches every backend, in an order rotated each round; the figures are the medians over rounds:
- for step time, with nothing set: the allocator a user gets (glibc's, with huge pages: the huge_pages setting),
  in `repeats` + 2 rounds: a step's time drifts 5-10% between launches (a 10% goal needs more than 3), while
- memory, with MALLOC_MMAP_THRESHOLD_=65536 (freed tensors leave RSS at once, so the peak measures live memory:
  the issue's measure; peak = the largest VmHWM over ranks), comes out within 1-2 MB each launch: a second launch
  in the first `repeats` rounds only, timing 3 warm steps (the peak is reached in the first three steps).
  The fixed threshold makes every tensor over 64 KiB fresh pages: without huge pages the bench model's fsdp step
  took 355k page faults and 1.57 s, ddp's 162k and 0.75 s (2.1x), against 35k / 0.86 s and 15k / 0.76 s with them.
The step rows are also split into forward, backward and optimizer step (rank 0, the same launches), each against
ddp's, and into rank 0's CPU time: its main thread on a core, off it (the wall time less that: waiting for a
synchronous collective, or for a core), and gloo's threads. The serial floor (compute + raw gloo collectives, timed
apart by workloads/sharded_floor.py with nothing set) is the fastest a step could be with nothing overlapped;
sharded_floor.py explains its terms. One profiled launch per backend (workloads/step_profile.py) then says where the
step's time goes: matmuls, copies, allocation and fills, collectives, other operators, Python and waiting.
"""

from __future__ import annotations

import statistics

from common import ACC, WORKLOADS, Result, bench_line, env_for_bench
from sharded_floor import floors

BACKENDS = {"ddp": ["--backend", "ddp"], "fsdp": ["--backend", "fsdp"],
            "deepspeed ZeRO-3": ["--backend", "deepspeed", "--zero-stage", "3"]}
WORKLOAD = "8 x (Linear(2500, 2500) + ReLU), ~200 MB fp32, init_module, AdamW, batch 8, 2 processes on gloo, defaults"
MEMORY = WORKLOAD + ", MALLOC_MMAP_THRESHOLD_=65536"
THRESHOLD = {"memory": ", mmap threshold 64 KiB", "plain": ""}
STEP_ROUNDS_EXTRA = 2  # step-time rounds beyond `repeats`
MEMORY_STEPS = 3  # warm steps a memory launch times


def run(repeats: int) -> list[Result]:
    memory_env, plain_env = env_for_bench(MALLOC_MMAP_THRESHOLD_="65536"), env_for_bench()
    base = [ACC, "launch", "--output-dir", "", "--nproc", "2"]
    script = str(WORKLOADS / "sharded_step.py")
    peaks: dict[str, list[float]] = {name: [] for name in BACKENDS}
    steps: dict[str, list[float]] = {name: [] for name in BACKENDS}
    # a step split two ways, per backend: "phases" (forward, backward, optimizer step) and "cpu" (rank 0's CPU time)
    parts: dict[str, dict[str, dict[str, list[float]]]] = {split: {name: {} for name in BACKENDS}
                                                          for split in ("phases", "cpu")}
    faults: dict[str, dict[str, list[float]]] = {"memory": {name: [] for name in BACKENDS},
                                                 "plain": {name: [] for name in BACKENDS}}
    names = list(BACKENDS)
    step_rounds = repeats + STEP_ROUNDS_EXTRA
    for round_ in range(step_rounds):
        for name in names[round_ % len(names):] + names[:round_ % len(names)]:
            command = [*base, *BACKENDS[name], script, "--init-module"]
            if round_ < repeats:
                measured = bench_line([*command, "--steps", str(MEMORY_STEPS)], memory_env)
                peaks[name].append(measured["peak_rss_mb"])
                faults["memory"][name].append(measured["minor_faults_per_step"])
            plain = bench_line(command, plain_env)
            steps[name].append(plain["per_step_s"])
            cpu = {"main thread on a core": plain["main_thread_cpu_s"],
                   "main thread off it (waiting)": plain["per_step_s"] - plain["main_thread_cpu_s"],
                   "other threads (gloo's)": plain["process_cpu_s"] - plain["main_thread_cpu_s"]}
            for split, got in (("phases", plain["phases_s"]), ("cpu", cpu)):
                for part, seconds in got.items():
                    parts[split][name].setdefault(part, []).append(seconds)
            faults["plain"][name].append(plain["minor_faults_per_step"])
    step = {name: statistics.median(values) for name, values in steps.items()}
    fault = {how: {name: statistics.median(values) for name, values in got.items()} for how, got in faults.items()}
    peak = {name: statistics.median(values) for name, values in peaks.items()}
    split = {how: {name: {p: statistics.median(v) for p, v in got.items()} for name, got in by_name.items()}
             for how, by_name in parts.items()}
    pieces = bench_line([*base, "--backend", "ddp", str(WORKLOADS / "sharded_floor.py"), "--repeats", "3"],
                        plain_env)
    floor = floors(pieces)
    profiled = {name: bench_line([*base, *flags, str(WORKLOADS / "step_profile.py")], plain_env)
                for name, flags in BACKENDS.items()}
    n, m = repeats, step_rounds  # memory rounds, step-time rounds
    runs = {"memory": n, "plain": m}
    peak_title = "per-rank peak RSS, 2 processes, defaults"
    step_title = "step time, 2 processes, defaults"
    floor_title = "step time vs its serial floor (compute + raw gloo collectives), 2 processes, defaults"
    return [
        Result(peak_title, "fsdp", "ddp", peak["fsdp"], peak["ddp"], "MB", n, MEMORY + "; goal <= 0.55"),
        Result(peak_title, "deepspeed ZeRO-3", "ddp", peak["deepspeed ZeRO-3"], peak["ddp"], "MB", n,
               MEMORY + "; goal <= 0.60"),
        Result(step_title, "deepspeed ZeRO-3", "ddp", step["deepspeed ZeRO-3"], step["ddp"], "s/step", m,
               WORKLOAD + "; goal <= 1.30"),
        Result(step_title, "fsdp", "ddp", step["fsdp"], step["ddp"], "s/step", m, WORKLOAD + "; goal <= 1.10"),
        *(Result(title, f"{name}: {p}", f"ddp: {p}", split[how][name][p], split[how]["ddp"][p], "s/step", m,
                 WORKLOAD + note)
          for how, title, note in (
              ("phases", "a step's phases against ddp's, 2 processes, defaults",
               "; rank 0, the same launches as the step rows"),
              ("cpu", "a step's CPU time against ddp's, 2 processes, defaults",
               "; rank 0, the same launches; off a core = the step's wall time less the main thread's CPU time "
               "(a synchronous collective, or the 2 cores busy)"))
          for name in ("fsdp", "deepspeed ZeRO-3") for p in split[how]["ddp"]),
        Result(floor_title, "fsdp", "fsdp floor", step["fsdp"], floor["fsdp"], "s/step", m,
               f"compute {pieces['compute_sharded_s']:.3f} s sharded + all-gather x 15/8 + reduce-scatter; "
               "goal <= 1.5"),
        Result(floor_title, "deepspeed ZeRO-3", "deepspeed ZeRO-3 floor", step["deepspeed ZeRO-3"],
               floor["deepspeed ZeRO-3"], "s/step", m,
               f"compute {pieces['compute_sharded_s']:.3f} s sharded + all-gather x 2 + reduce-scatter; goal <= 1.5"),
        Result(floor_title, "ddp", "ddp floor", step["ddp"], floor["ddp"], "s/step", m,
               f"compute {pieces['compute_full_s']:.3f} s full + all-reduce {pieces['allreduce_s']:.3f} s"),
        *(Result("page faults per step (fresh pages touched), 2 processes, defaults", name + THRESHOLD[how],
                 "ddp" + THRESHOLD[how], fault[how][name], fault[how]["ddp"], "faults", runs[how],
                 (MEMORY if how == "memory" else WORKLOAD) + "; the largest rank's minor faults")
          for how in ("plain", "memory") for name in ("fsdp", "deepspeed ZeRO-3")),
        *(Result("where a profiled step's time goes (share of the step), 2 processes, defaults", f"{name}: {kind}",
                 f"{name}: whole step", got[kind], got["wall"], "s/step", 1,
                 WORKLOAD + "; torch.profiler, operators' own time (workloads/step_profile.py), largest rank")
          for name, got in profiled.items() for kind in sorted(got) if kind != "wall"),
    ]
