"""save_state / load_state of a ~100 MB model vs plain torch.save / torch.load of the same state dicts."""

from __future__ import annotations

from common import ACC, WORKLOADS, Result, bench_line, env_for_bench


def run(repeats: int) -> list[Result]:
    out = bench_line([ACC, "launch", "--output-dir", "", str(WORKLOADS / "checkpoint_io.py"), str(repeats)],
                     env_for_bench())
    note = (f"{out['params_mb']:.0f} MB of parameters + AdamW state; acc also hashes every file (BLAKE3, while "
            "writing it), fsyncs each file and the directory, renames atomically, and loading verifies the hashes")
    return [
        Result("checkpoint save", "acc save_state", "torch.save", out["acc_save"], out["torch_save"], "s", repeats,
               note),
        Result("checkpoint load", "acc load_state", "torch.load + load_state_dict", out["acc_load"],
               out["torch_load"], "s", repeats, note),
    ]
