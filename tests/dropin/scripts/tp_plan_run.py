"""A tiny Llama (config built locally, no downloads) loaded with transformers' `from_pretrained` and trained 3 SGD
steps through acc's Accelerator; with `--tp-plan`, loaded as `from_pretrained(tp_size=..., tp_plan="auto",
device_mesh=accelerator.torch_device_mesh)` (transformers parallelizes it on the mesh's tp dim; run under
`acc launch --parallelism-config-tp-size N`, with `--parallelism-config-dp-shard-size M` also sharded by fsdp over
the other dim, each dp rank reading its share of the same global batches). Writes the first forward's logits and the final full weights to
--out (main process).

    python tp_plan_run.py --build DIR                 # the checkpoint, once
    python tp_plan_run.py --model DIR --out F.pt      # the one-process reference
    acc launch --backend fsdp --nproc 2 --parallelism-config-tp-size 2 tp_plan_run.py --model DIR --out F.pt --tp-plan
"""

import argparse

import torch
from accelerate import Accelerator
from transformers import LlamaConfig, LlamaForCausalLM

STEPS, BATCH, SEQ = 3, 4, 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--build")
    parser.add_argument("--model")
    parser.add_argument("--out")
    parser.add_argument("--tp-plan", action="store_true", help="from_pretrained(tp_plan='auto', ...): transformers "
                        "parallelizes the model (transformers 5.23: tp over every process, as it ignores device_mesh)")
    args = parser.parse_args()
    if args.build:
        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                             num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
        LlamaForCausalLM(config).save_pretrained(args.build)
        return
    accelerator = Accelerator()
    config = accelerator.parallelism_config
    # the arguments Accelerate's examples/torch_native_parallelism/nd_parallel.py passes
    extra = {"tp_size": config.tp_size, "tp_plan": "auto", "device_mesh": accelerator.torch_device_mesh} \
        if args.tp_plan else {}
    model = LlamaForCausalLM.from_pretrained(args.model, dtype=torch.float32, **extra)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)  # as Accelerate's nd_parallel example (SGD)
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (STEPS * BATCH, SEQ), generator=g)
    dp = accelerator.num_processes // (config.tp_size if config is not None else 1)  # each dp rank: its share
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(ids), batch_size=BATCH // dp)
    model, opt, loader = accelerator.prepare(model, opt, loader)
    with torch.no_grad():
        logits = model(input_ids=ids[:BATCH]).logits
    logits = logits.full_tensor() if hasattr(logits, "full_tensor") else logits
    losses = []
    for (batch,) in loader:
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        losses.append(float(accelerator.reduce(loss.detach(), "mean")))  # the global batch's loss
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        torch.save({"logits": logits.detach().cpu(), "losses": losses, "world": accelerator.num_processes,
                    "dtensor": sum(type(p).__name__ == "DTensor" for p in model.parameters()),
                    "weights": {k: v.detach().cpu() for k, v in state.items()}}, args.out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
