"""What transformers' Trainer relies on in acc, with real processes; each rank writes what it saw.

    acc launch --backend fsdp --nproc 2 hf_trainer_hooks.py --check fsdp --plugin full --out DIR
    acc launch --backend fsdp --nproc 2 hf_trainer_hooks.py --check fsdp --plugin none --out DIR
    acc launch --backend deepspeed --nproc 2 hf_trainer_hooks.py --check deepspeed --out DIR

fsdp: `AcceleratorState().fsdp_plugin` (the given FullyShardedDataParallelPlugin, or acc's FSDP2 default), then
`save_fsdp_model`/`save_fsdp_optimizer` with that plugin (as the Trainer passes it), one more optimizer step and a
perturbation of the weights, `load_fsdp_model`/`load_fsdp_optimizer`, and one more step from what was loaded.
deepspeed: `DeepSpeedPlugin(hf_ds_config=HfDeepSpeedConfig(...))` completed after the Accelerator is built, as the
Trainer's trainer_config_finalize does, and read again at prepare.
"""

import argparse
import os
import warnings

import torch
from common import dump
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from acc import Accelerator, set_seed
from acc.state import AcceleratorState


def build() -> nn.Module:
    set_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)


def full_weights(accelerator, model) -> dict:
    """accelerator.get_state_dict on every rank: the full weights on the main process (as lists)."""
    return {k: v.detach().float().flatten().tolist() for k, v in accelerator.get_state_dict(model).items()}


def local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def optimizer_shards(model, optimizer) -> dict:
    """This rank's optimizer state (exp_avg, exp_avg_sq, step of each parameter, its local shard), by name."""
    inner = getattr(optimizer, "optimizer", optimizer)
    out = {}
    for name, param in model.named_parameters():
        for key, value in inner.state.get(param, {}).items():
            out[f"{name}.{key}"] = local(value).detach().float().flatten().tolist() if torch.is_tensor(value) \
                else [float(value)]
    return out


def train_step(accelerator, model, optimizer, step: int) -> float:
    x, y = batch(step)
    loss = nn.functional.mse_loss(model(x.to(accelerator.device)), y.to(accelerator.device))
    accelerator.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def check_fsdp(args) -> None:
    from acc.utils import (
        FullyShardedDataParallelPlugin,
        load_fsdp_model,
        load_fsdp_optimizer,
        save_fsdp_model,
        save_fsdp_optimizer,
    )

    given = FullyShardedDataParallelPlugin(state_dict_type="FULL_STATE_DICT") if args.plugin == "full" else None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        accelerator = Accelerator(fsdp_plugin=given)
    plugin = AcceleratorState().fsdp_plugin
    same_again = AcceleratorState().fsdp_plugin is plugin  # the Trainer reads it again and again: one object
    rank = accelerator.process_index
    res = {"world": accelerator.num_processes, "distributed_type": str(accelerator.distributed_type),
           "init_warnings": [f"{w.category.__name__}: {w.message}" for w in caught],
           "plugin_is_given": plugin is given, "plugin_stable": same_again, "plugin_type": type(plugin).__name__,
           "fsdp_version": getattr(plugin, "fsdp_version", None),
           "state_dict_type": str(getattr(plugin, "state_dict_type", None))}

    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    res["param_types"] = sorted({type(p).__name__ for p in model.parameters()})
    for step in range(2):
        train_step(accelerator, model, optimizer, step)

    out = os.path.join(args.out, "ckpt")
    saved_weights, saved_opt = full_weights(accelerator, model), optimizer_shards(model, optimizer)
    model_path = save_fsdp_model(plugin, accelerator, model, out)
    opt_path = save_fsdp_optimizer(plugin, accelerator, optimizer, model, out)
    res["written"] = [os.path.basename(str(model_path)), os.path.basename(str(opt_path))]
    res["listing"] = sorted(os.listdir(out))
    if args.plugin == "full":  # the same save into a directory of this rank's own: which ranks write the files
        own = os.path.join(args.out, f"own{rank}")
        save_fsdp_model(plugin, accelerator, model, own)
        save_fsdp_optimizer(plugin, accelerator, optimizer, model, own)
        res["own_listing"] = sorted(os.listdir(own))

    # the step from what was saved (the reference), then the weights perturbed: state that must not survive the load
    res["continued_loss"] = train_step(accelerator, model, optimizer, 2)
    res["continued_weights"] = full_weights(accelerator, model)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    res["perturbed_weights"], res["perturbed_opt"] = full_weights(accelerator, model), optimizer_shards(model, optimizer)

    load_fsdp_model(plugin, accelerator, model, out)
    load_fsdp_optimizer(plugin, accelerator, optimizer, model, out)
    res["saved_weights"], res["saved_opt"] = saved_weights, saved_opt
    res["loaded_weights"], res["loaded_opt"] = full_weights(accelerator, model), optimizer_shards(model, optimizer)
    res["param_types_after_load"] = sorted({type(p).__name__ for p in model.parameters()})
    # the same step again, from what was loaded: the optimizer state is bound to the model's parameters again
    res["reloaded_loss"] = train_step(accelerator, model, optimizer, 2)
    res["reloaded_weights"] = full_weights(accelerator, model)
    dump(args.out, rank, res)
    accelerator.end_training()


def check_deepspeed(args) -> None:
    from acc.utils import DeepSpeedPlugin, GradientAccumulationPlugin
    from acc.utils.deepspeed import HfDeepSpeedConfig

    cfg = HfDeepSpeedConfig({"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
                             "gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2}})
    accelerator = Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=cfg),
                              gradient_accumulation_plugin=GradientAccumulationPlugin(num_steps=1))
    view = AcceleratorState().deepspeed_plugin
    res = {"world": accelerator.num_processes, "hf_ds_config_is_cfg": view.hf_ds_config is cfg,
           "clipping_before": view.deepspeed_config.get("gradient_clipping")}
    cfg.config["gradient_clipping"] = 0.5  # transformers' Trainer: trainer_config_finalize, after the Accelerator

    model = build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(32, 8, generator=g)
    loader = DataLoader(TensorDataset(x, torch.randn(32, 4, generator=g)), batch_size=4)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    view = AcceleratorState().deepspeed_plugin
    res["prepare_warnings"] = [f"{w.category.__name__}: {w.message}" for w in caught]
    res["hf_ds_config_is_cfg_after"] = view.hf_ds_config is cfg
    res["config_after"] = {k: view.deepspeed_config.get(k) for k in ("gradient_clipping", "gradient_accumulation_steps",
                                                                     "train_micro_batch_size_per_gpu",
                                                                     "train_batch_size")}
    res["accelerator_gas"] = accelerator.gradient_accumulation_steps
    engine = accelerator.ctx.backend_state["engine"]
    res["engine_clipping"] = engine.gradient_clipping()
    res["engine_gas"] = engine.gradient_accumulation_steps()
    micro = 0
    for xb, yb in loader:  # 4 micro-batches per rank: 2 optimizer steps with 2 accumulation steps
        with accelerator.accumulate(model):
            loss = nn.functional.mse_loss(model(xb), yb)
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        micro += 1
    res["micro_batches"], res["engine_steps"] = micro, engine.global_steps
    dump(args.out, accelerator.process_index, res)
    accelerator.end_training()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--check", choices=["fsdp", "deepspeed"], required=True)
    p.add_argument("--plugin", choices=["full", "none"], default="none", help="fsdp: the plugin given, if any")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    check_fsdp(args) if args.check == "fsdp" else check_deepspeed(args)


if __name__ == "__main__":
    main()
