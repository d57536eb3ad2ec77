"""One transformers `from_pretrained(device_map="auto", max_memory=..., offload_folder=...)` + forward of the
from_pretrained benchmark, in a venv whose `accelerate` is acc's drop-in or Hugging Face Accelerate (the script
imports only transformers and torch).

    python from_pretrained_load.py make CHECKPOINT_DIR             # write the checkpoint once
    python from_pretrained_load.py load CHECKPOINT_DIR OFFLOAD_DIR

`load` prints one BENCH line: load and forward seconds, peak RSS of the process, the device map, the accelerate
version serving it and the first logits.
"""

import json
import resource
import sys
import time

import torch
from transformers import LlamaConfig, LlamaForCausalLM

BUDGET = "150MB"  # of a ~420 MB float32 checkpoint: the rest goes to disk


def config() -> LlamaConfig:
    return LlamaConfig(vocab_size=8192, hidden_size=768, intermediate_size=2048, num_hidden_layers=12,
                       num_attention_heads=12, num_key_value_heads=12, max_position_embeddings=128)


def main() -> None:
    mode, checkpoint = sys.argv[1:3]
    if mode == "make":
        torch.manual_seed(0)
        LlamaForCausalLM(config()).save_pretrained(checkpoint, max_shard_size="100MB")
        return
    offload = sys.argv[3]
    ids = torch.arange(64).reshape(2, 32) % 8192
    start = time.perf_counter()
    model = LlamaForCausalLM.from_pretrained(checkpoint, device_map="auto", max_memory={"cpu": BUDGET},
                                             offload_folder=offload).eval()
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    with torch.no_grad():
        logits = model(ids).logits
    forward_s = time.perf_counter() - start
    print("BENCH " + json.dumps({
        "load_s": load_s, "forward_s": forward_s,
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,  # Linux: KiB
        "device_map": {str(k): str(v) for k, v in model.hf_device_map.items()},
        "accelerate": __import__("accelerate").__version__, "output": logits.double().flatten()[:8].tolist()}))


if __name__ == "__main__":
    main()
