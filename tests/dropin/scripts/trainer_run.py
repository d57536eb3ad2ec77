"""transformers' Trainer on a tiny causal LM built locally (no downloads): gradient accumulation, evaluation,
save_steps checkpoints and, with --resume, resume_from_checkpoint. It imports only transformers and torch, so the
same file runs on Hugging Face Accelerate and on acc's `accelerate` drop-in. Writes the loss of every logging step
and the final weights' digest to --out (JSON, main process)."""

import argparse
import json
import os

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainerCallback, TrainingArguments


class StepsTrainedHere(TrainerCallback):
    """The optimizer steps this process ran (a resumed run starts after its checkpoint's step)."""

    def __init__(self):
        self.steps = []

    def on_step_end(self, args, state, control, **kwargs):
        self.steps.append(state.global_step)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n, seed):
        g = torch.Generator().manual_seed(seed)
        self.ids = torch.randint(0, 64, (n, 16), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--fsdp", action="store_true", help="TrainingArguments(fsdp='full_shard'), FSDP2")
    parser.add_argument("--deepspeed", default=None, help="TrainingArguments(deepspeed=...): a ZeRO stage, 1-3")
    parser.add_argument("--lora", action="store_true", help="train a peft LoRA adapter (q_proj, v_proj) instead")
    args = parser.parse_args()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32)
    model = LlamaForCausalLM(config)
    if args.lora:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0, init_lora_weights="gaussian"))
    training = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=4, per_device_eval_batch_size=4,
        gradient_accumulation_steps=2, max_steps=args.max_steps, learning_rate=1e-3, logging_steps=1,
        eval_strategy="steps", eval_steps=3, save_steps=3, save_strategy="steps", report_to=[], seed=0,
        data_seed=0, use_cpu=True, dataloader_num_workers=0, disable_tqdm=True,
        **({"fsdp": "full_shard", "fsdp_config": {"version": 2, "reshard_after_forward": True,
                                                   "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                                                   "transformer_layer_cls_to_wrap": ["LlamaDecoderLayer"]}}
           if args.fsdp else {}),
        **({"deepspeed": {
            "zero_optimization": {"stage": int(args.deepspeed), "stage3_gather_16bit_weights_on_model_save": True},
            "train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",  # torch_adam: torch's AdamW, no DeepSpeed C++ op to build on this CPU
            "optimizer": {"type": "AdamW", "params": {"lr": "auto", "weight_decay": "auto", "torch_adam": True}},
        }} if args.deepspeed else {}),
    )
    here = StepsTrainedHere()
    trainer = Trainer(model=model, args=training, train_dataset=Tokens(96, 1), eval_dataset=Tokens(16, 2),
                      callbacks=[here])
    trainer.train(resume_from_checkpoint=args.resume or None)
    state = trainer.accelerator.get_state_dict(trainer.model_wrapped)  # every process: gathers sharded weights
    if trainer.is_world_process_zero():
        losses = {str(e["step"]): e["loss"] for e in trainer.state.log_history if "loss" in e}
        evals = {str(e["step"]): e["eval_loss"] for e in trainer.state.log_history if "eval_loss" in e}
        weights = {k: v.detach().double().flatten().tolist() for k, v in state.items()}
        with open(args.out, "w") as f:
            json.dump({"losses": losses, "eval_losses": evals, "weights": weights,
                       "world_size": training.world_size, "steps_here": here.steps, "accelerate": __import__("accelerate").__version__,
                       "pid": os.getpid()}, f)


if __name__ == "__main__":
    main()
