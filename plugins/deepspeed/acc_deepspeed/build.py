"""Models built sharded under ZeRO-3: `accelerator.init_module()` is `deepspeed.zero.Init`, which partitions each
module's parameters as soon as its `__init__` has run (values broadcast from process 0 first), so no process holds a
whole copy; `acc.load_checkpoint_in_model` then reads each process's partition alone from a safetensors file."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

from acc import backend as sdk

from . import config as ds_config


def init_config(ctx: sdk.RunContext) -> dict[str, Any]:
    """The parts of the completed DeepSpeed config `zero.Init` reads (stage, offload, dtype), before prepare knows the
    batch size (DeepSpeed's config parser insists on one; it does not change how parameters are partitioned)."""
    config, problems = ds_config.complete(ctx.backend_state["user_config"], ctx.settings, ctx.num_processes, None,
                                          where=ds_config.describe(ctx.settings["deepspeed_config"]))
    if problems:
        raise sdk.ConfigError("; ".join(problems))
    out = {key: config[key] for key in ("zero_optimization", "fp16", "bf16", "gradient_accumulation_steps")
           if key in config}
    micro = config.get("train_micro_batch_size_per_gpu")
    out["train_micro_batch_size_per_gpu"] = micro if isinstance(micro, int) else 1
    return out


class ZeroInitBuild(sdk.ShardedBuild):
    """`deepspeed.zero.Init` around the construction; each parameter's part is its ZeRO-3 partition (the flattened
    tensor cut in equal pieces, one per process)."""

    def __init__(self, config: dict[str, Any]):
        self._config = config
        self._params: dict[int, Any] = {}

    @contextlib.contextmanager
    def context(self) -> Iterator[None]:
        import deepspeed
        import torch

        seen: list[Any] = []
        handle = torch.nn.modules.module.register_module_parameter_registration_hook(
            lambda module, name, param: seen.append(param))
        try:
            with deepspeed.zero.Init(config_dict_or_path=self._config):
                yield
        finally:
            handle.remove()
        self._params.update({id(p): p for p in seen if hasattr(p, "ds_id")})

    def owns(self, param: Any) -> bool:
        return self._params.get(id(param)) is param

    def full_shape(self, param: Any) -> tuple[int, ...]:
        return tuple(param.ds_shape)

    def part(self, param: Any) -> tuple[int, int]:
        import torch.distributed as dist

        size = param.ds_tensor.ds_numel
        start = size * dist.get_rank(group=param.ds_process_group)
        return min(start, param.ds_numel), min(start + size, param.ds_numel)

    def store(self, param: Any, values: Any) -> None:
        start, stop = self.part(param)
        if values.dim() != 1 or values.numel() != stop - start:
            raise sdk.AccError(f"a stored part has {values.numel()} element(s); this process's ZeRO-3 partition of the "
                               f"{self.full_shape(param)} parameter holds elements {start}..{stop}")
        param.ds_tensor.data.view(-1)[: stop - start].copy_(values)
