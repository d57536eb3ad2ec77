"""transformers' from_pretrained(device_map="auto", max_memory=..., offload_folder=...) of a tiny causal LM saved
locally, with a CPU budget that sends part of it to disk; writes the device map and the largest difference of its
logits from the model loaded whole (JSON, --out). Imports only transformers and torch: it runs on Hugging Face
Accelerate and on acc's drop-in alike."""

import argparse
import json

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--cpu-budget", default="500KB")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=4,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    LlamaForCausalLM(config).save_pretrained(f"{args.workdir}/checkpoint")
    ids = torch.randint(0, 64, (2, 16))
    whole = LlamaForCausalLM.from_pretrained(f"{args.workdir}/checkpoint").eval()
    with torch.no_grad():
        expected = whole(ids).logits
    split = LlamaForCausalLM.from_pretrained(f"{args.workdir}/checkpoint", device_map="auto",
                                             max_memory={"cpu": args.cpu_budget},
                                             offload_folder=f"{args.workdir}/offload").eval()
    with torch.no_grad():
        got = split(ids).logits
    with open(args.out, "w") as f:
        json.dump({"device_map": {k: str(v) for k, v in split.hf_device_map.items()},
                   "max_difference": (got - expected).abs().max().item()}, f)


if __name__ == "__main__":
    main()
