"""Accelerator(parallelism_config=ParallelismConfig(...)) on a real run: each rank writes the device mesh it got
(dimension names and sizes, its coordinate, the flattened submeshes), the sum of rank+1 over the `dp` submesh's
process group, or the AccError the configuration was refused with.

    acc launch --backend ddp --nproc 2 parallelism_config.py --out DIR --sizes dp_replicate=2 [--fsdp-plugin]

`--fsdp-plugin` also gives the Accelerator a FullyShardedDataParallelPlugin(), as Accelerate's nd_parallel.py does
(`--deepspeed-plugin`: a DeepSpeedPlugin(zero_stage=2)).
Each rank also writes the backend that ran it and the distributed type.
"""

import argparse
import warnings

import torch
import torch.distributed as dist
from common import dump

from acc import Accelerator, AccError, ParallelismConfig
from acc.state import AcceleratorState
from acc.utils import DeepSpeedPlugin, FullyShardedDataParallelPlugin


def _flattened(mesh) -> set:
    names = set()
    for name in ("dp", "dp_shard_cp", "dp_cp"):
        try:
            mesh[name]
        except (KeyError, RuntimeError, ValueError):
            continue
        names.add(name)
    return names


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--sizes", nargs="*", default=[], help="DIM=SIZE, e.g. dp_shard=2")
    parser.add_argument("--fsdp-plugin", action="store_true")
    parser.add_argument("--deepspeed-plugin", action="store_true")
    args = parser.parse_args()
    sizes = {f"{k}_size": int(v) for k, v in (item.split("=") for item in args.sizes)}
    rank = int(__import__("os").environ.get("RANK", "0"))
    warnings.filterwarnings("ignore", message="Slicing a flattened dim")  # torch's note on mesh["dp"], Accelerate's API
    try:  # without --sizes the launch flags give the sizes (--parallelism-config-*-size)
        accelerator = Accelerator(parallelism_config=ParallelismConfig(**sizes) if sizes else None,
                                  fsdp_plugin=FullyShardedDataParallelPlugin() if args.fsdp_plugin else None,
                                  deepspeed_plugin=DeepSpeedPlugin(zero_stage=2) if args.deepspeed_plugin else None)
    except AccError as exc:
        dump(args.out, rank, {"error": str(exc)})
        return
    mesh = accelerator.torch_device_mesh
    total = torch.tensor([float(accelerator.process_index + 1)])
    has_dp = "dp" in _flattened(mesh)  # a tp-only mesh has no data-parallel dimension
    if has_dp:
        dist.all_reduce(total, group=mesh["dp"].get_group())
    # without a cp dim, Accelerate's context-parallel block leaves the buffers whole (nd_parallel.py calls it anyway)
    ids = torch.arange(12.0).reshape(2, 6)
    with accelerator.maybe_context_parallel(buffers=[ids], buffer_seq_dims=[1], no_restore_buffers={ids}):
        inside = ids.tolist()
    dump(args.out, accelerator.process_index, {
        "names": list(mesh.mesh_dim_names), "shape": list(mesh.mesh.shape), "coordinate": mesh.get_coordinate(),
        "dp_size": mesh["dp"].size() if has_dp else None, "dp_sum": total.item() if has_dp else None, "device_type": mesh.device_type,
        "cp_block": inside, "backend": accelerator.backend, "distributed_type": str(accelerator.distributed_type),
        "same_mesh": AcceleratorState().device_mesh is mesh,
        "same_config": AcceleratorState().parallelism_config is accelerator.parallelism_config,
        "flattened": {name: mesh[name].size() for name in ("dp", "dp_shard_cp", "dp_cp")
                      if name in _flattened(mesh)},
    })


if __name__ == "__main__":
    main()
