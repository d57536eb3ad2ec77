"""A training script written as Accelerate's examples/torch_native_parallelism/nd_parallel.py writes one (acc's own
code; the calls are the example's): a ParallelismConfig from the command line, a FullyShardedDataParallelPlugin
only when dp_shard is enabled, `log_with=["wandb"]` whether wandb is installed or not, `from_pretrained(tp_size,
tp_plan="auto", device_mesh=accelerator.torch_device_mesh)` when tp is enabled, SGD, a DataLoader of batch 1 per
process, `maybe_context_parallel` around every step, the loss averaged over `torch_device_mesh["dp_cp"]` with
`dist.all_reduce(..., ReduceOp.AVG)`, `save_state` while sharded, `accelerator.log`.

It is started with a plain `acc launch --nproc N` (no --backend), as the example is with `accelerate launch`, and
writes (main process) each step's averaged loss, the final full weights, the distributed type and how many
parameters are DTensors. The one-process reference is the same script on `acc launch --backend ddp --nproc 1` with
`--batch` = the data-parallel size (the global batch of the parallel run). fp32 throughout, so the two agree to
rounding; the example's bf16 is `--mixed-precision bf16`.

    acc launch --nproc 2 nd_parallel_style.py --model DIR --out F.pt --dp-shard-size 2 --save-dir D
"""

import argparse

import torch
import torch.distributed as dist
from accelerate import Accelerator
from accelerate.parallelism_config import ParallelismConfig
from accelerate.utils import FullyShardedDataParallelPlugin, set_seed
from torch.utils.data import DataLoader
from transformers import AutoModelForCausalLM

STEPS, SEQ = 3, 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--save-dir")
    parser.add_argument("--dp-replicate-size", type=int, default=1)
    parser.add_argument("--dp-shard-size", type=int, default=1)
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--mixed-precision", default="no")
    args = parser.parse_args()
    set_seed(42)
    config = ParallelismConfig(dp_replicate_size=args.dp_replicate_size, dp_shard_size=args.dp_shard_size,
                               tp_size=args.tp_size)
    plugin = None
    if config.dp_shard_enabled:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=["LlamaDecoderLayer"],
                                                state_dict_type="SHARDED_STATE_DICT")
    accelerator = Accelerator(log_with=["wandb"], mixed_precision=args.mixed_precision, parallelism_config=config,
                              fsdp_plugin=plugin)
    accelerator.init_trackers("nd_parallel_style")
    extra = ({"tp_size": args.tp_size, "tp_plan": "auto", "device_mesh": accelerator.torch_device_mesh}
             if args.tp_size > 1 else {})
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, use_cache=False, **extra)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(1)
    rows = torch.randint(0, 128, (STEPS * args.batch * config.dp_replicate_size * config.dp_shard_size, SEQ + 1),
                         generator=g)
    samples = [{"input_ids": r[:-1].tolist(), "shift_labels": r[1:].tolist()} for r in rows]

    def collate(batch):
        ids = torch.tensor([item["input_ids"] for item in batch])
        labels = torch.tensor([item["shift_labels"] for item in batch])
        return {"input_ids": ids, "shift_labels": labels, "labels": labels}

    loader = DataLoader(samples, batch_size=args.batch, collate_fn=collate)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    losses = []
    for step, batch in enumerate(loader):
        batch["position_ids"] = torch.arange(0, batch["input_ids"].size(1)).unsqueeze(0)
        buffers = [batch["input_ids"], batch["shift_labels"], batch["labels"], batch["position_ids"]]
        with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1, 1, 1],
                                                no_restore_buffers=set(buffers)):
            group = (accelerator.torch_device_mesh["dp_cp"].get_group()
                     if accelerator.parallelism_config.dp_cp_dim_names else None)
            loss = model(**batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad(set_to_none=False)
            dist.all_reduce(loss, op=dist.ReduceOp.AVG, group=group)
        losses.append(loss.item())
        if step == 1 and args.save_dir and config.dp_shard_enabled:
            accelerator.save_state(args.save_dir)
        accelerator.log({"loss": loss.item()})
    state = accelerator.get_state_dict(model)
    if accelerator.is_main_process:
        torch.save({"losses": losses, "world": accelerator.num_processes,
                    "distributed_type": str(accelerator.distributed_type),
                    "dtensor": sum(type(p).__name__ == "DTensor" for p in model.parameters()),
                    "weights": {k: v.detach().cpu() for k, v in state.items()}}, args.out)
    accelerator.end_training()


if __name__ == "__main__":
    main()
