"""One load_checkpoint_and_dispatch + forward of the big-model benchmark, by acc or by Accelerate.

    python big_model_load.py acc|accelerate CHECKPOINT_DIR OFFLOAD_DIR

Prints one BENCH line: load and forward seconds, peak RSS (the whole process) after load and after
the forward, the bytes of weights kept in memory, and a checksum of the output.
"""

import json
import resource
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import torch  # noqa: E402
from big_model_common import BUDGET, BigNet, example_input  # noqa: E402


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


def main() -> None:
    impl, checkpoint, offload = sys.argv[1:4]
    if impl == "acc":
        from acc.big_model import init_empty_weights, load_checkpoint_and_dispatch
    else:
        from accelerate import init_empty_weights, load_checkpoint_and_dispatch
    x = example_input()
    start = time.perf_counter()
    with init_empty_weights():
        model = BigNet().eval()
    model = load_checkpoint_and_dispatch(model, checkpoint, device_map="auto", max_memory={"cpu": BUDGET},
                                         no_split_module_classes=["Block"], offload_folder=offload)
    load_s = time.perf_counter() - start
    load_peak = peak_bytes()
    resident = sum(p.numel() * p.element_size() for p in model.parameters() if p.device.type != "meta")
    start = time.perf_counter()
    with torch.no_grad():
        y = model(x)
    forward_s = time.perf_counter() - start
    print("BENCH " + json.dumps({"load_s": load_s, "forward_s": forward_s, "load_peak_rss": load_peak,
                                 "peak_rss": peak_bytes(), "resident_bytes": resident,
                                 "output": y.double().flatten()[:8].tolist(),
                                 "device_map": {str(k): str(v) for k, v in model.hf_device_map.items()}}))


if __name__ == "__main__":
    main()
