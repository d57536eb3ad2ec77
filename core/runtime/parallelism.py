"""`Accelerator(parallelism_config=...)`: Accelerate's ParallelismConfig checked against the run before anything is
prepared (the sizes' product against the processes; each dimension above 1 against the mesh dimensions the
backend declares it drives, `Capabilities.mesh_dims`), and its device mesh built on the run's process group.
"""

from __future__ import annotations

from typing import Any

from acc.errors import AccError

DIMS = ("dp_replicate", "dp_shard", "tp", "cp", "sp")


def setting_name(dim: str) -> str:
    """The launch setting of a dimension's size (`--parallelism-config-tp-size`, Accelerate's spelling too)."""
    return f"mesh_{dim}_size"


def sizes_from_settings(settings: Any) -> dict[str, int] | None:
    """The sizes the launch settings give (a size left out is 1), or None when none is given."""
    given = {dim: settings.get(setting_name(dim)) for dim in DIMS}
    if all(v is None for v in given.values()):
        return None
    return {dim: int(v) if v is not None else 1 for dim, v in given.items()}


def size_problems(sizes: dict[str, int], num_processes: int, backend: str, drives: tuple[str, ...],
                  settings: Any) -> list[str]:
    """What is wrong with these sizes for this run: their product against the processes, a dimension above 1 the
    backend does not drive (naming the installed backends that do)."""
    total = 1
    for size in sizes.values():
        total *= size
    product = " x ".join(f"{dim}_size {size}" for dim, size in sizes.items())
    if total != num_processes:
        return [f"ParallelismConfig: {product} = {total} processes, but this run has {num_processes}: launch "
                f"{total} processes (acc launch --nproc {total}), or give sizes whose product is {num_processes}"]
    if sizes.get("cp", 1) > 1 and _on_cpu(settings):
        return [f"ParallelismConfig(cp_size={sizes['cp']}): context parallel needs CUDA. On the CPU, torch's "
                "context_parallel cannot shard attention: SDPA's CPU kernel (aten._scaled_dot_product_flash_attention"
                "_for_cpu) has no DTensor sharding strategy, and its math backend mixes Tensor and DTensor (measured "
                "on torch 2.13 with gloo). Run on GPUs, or give cp_size 1"]
    problems = []
    for dim, size in sizes.items():
        if size > 1 and dim not in drives:
            others = [name for name in backends_driving(dim, settings) if name != backend]
            where = (f"backends that drive {dim}: {', '.join(others)} (acc launch --backend {others[0]})" if others
                     else f"no installed backend drives {dim} yet")
            problems.append(f"ParallelismConfig({dim}_size={size}): the {backend} backend drives "
                            f"{', '.join(drives) or 'no parallel dimension'}; {where}")
    return problems


def _on_cpu(settings: Any) -> bool:
    """Whether this run's processes compute on the CPU (--cpu, or no CUDA device visible)."""
    from acc.assembly.hardware import visible_cuda_devices

    try:
        forced = bool(settings["cpu"])
    except (KeyError, TypeError):
        forced = False
    return forced or visible_cuda_devices() == 0


def check_parallelism(config: Any, num_processes: int, backend: str, capabilities: Any, settings: Any) -> Any:
    """`config` when the run can drive it; without one, the one the launch settings give (--parallelism-config-*-size),
    else None. An AccError says what was given, what this run has and how to fix it."""
    from acc.compat.parallelism_objects import ParallelismConfig

    if config is None:
        sizes = sizes_from_settings(settings)
        if sizes is None:
            return None
        config = ParallelismConfig(**{f"{dim}_size": size for dim, size in sizes.items()})
    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"Accelerator(parallelism_config=...): expected an acc.ParallelismConfig (Accelerate's), got "
                        f"{type(config).__name__}")
    sizes = {dim: int(getattr(config, f"{dim}_size")) for dim in DIMS}
    problems = size_problems(sizes, num_processes, backend, tuple(capabilities.mesh_dims), settings)
    if problems:
        raise AccError("; ".join(problems))
    return config


def mesh_lines(sizes: dict[str, int]) -> list[str]:
    """The mesh as `acc launch --dry-run` draws it: its dims outermost first, each global rank's coordinate, and the
    process groups of each dim (the ranks a collective over that dim joins)."""
    from acc.compat.parallelism_objects import MESH_ORDER

    dims = [d for d in MESH_ORDER if sizes.get(d, 1) > 1]
    if not dims:
        return ["no dimension above 1: one data-parallel group of every process"]
    shape = [sizes[d] for d in dims]
    world = 1
    for n in shape:
        world *= n

    def coordinate(rank: int) -> tuple[int, ...]:
        out = []
        for n in reversed(shape):
            out.append(rank % n)
            rank //= n
        return tuple(reversed(out))

    coords = {rank: coordinate(rank) for rank in range(world)}
    lines = [" x ".join(f"{d} {n}" for d, n in zip(dims, shape)) + " (outermost first)",
             "rank (" + ", ".join(dims) + "): " + "; ".join(f"{r} ({', '.join(map(str, c))})" for r, c in coords.items())]
    for i, dim in enumerate(dims):
        groups: dict[tuple[int, ...], list[int]] = {}
        for rank, c in coords.items():
            groups.setdefault(c[:i] + c[i + 1:], []).append(rank)
        lines.append(f"{dim} groups: " + " ".join(str(g) for g in groups.values()))
    dp = [d for d in dims if d.startswith("dp_")]
    dp_size = 1
    for d in dp:
        dp_size *= sizes[d]
    if dp and dp_size == world:
        lines.append(f"dp ({' x '.join(dp)}) spans every process: gradients are averaged and data is sharded over it")
    return lines


def backends_driving(dim: str, settings: Any) -> list[str]:
    """The installed backends whose declared capabilities drive mesh dimension `dim` (asked with this run's
    settings; a backend that cannot answer for them is left out). For error messages: it imports every backend."""
    from acc.assembly.plugins import detection_manager
    from acc.contract.capabilities import Capabilities

    pm, _ = detection_manager()
    found = []
    for impl in pm.hook.acc_capabilities.get_hookimpls():
        try:
            answer = impl.function(settings=settings)
        except Exception:  # noqa: BLE001 - its settings are not this run's: it cannot say here
            continue
        if isinstance(answer, Capabilities) and dim in answer.mesh_dims:
            found.append(impl.plugin_name)
    return sorted(set(found))


def device_mesh(config: Any, device: Any, num_processes: int) -> Any:
    """The config's torch DeviceMesh on the run's device type (None without a config, on one process, or when no
    dimension is above 1), built once: Accelerate's `accelerator.torch_device_mesh`."""
    if config is None or num_processes < 2:
        return None
    return config.get_device_mesh(getattr(device, "type", str(device)))


def run_mesh(ctx: Any) -> Any:
    """The DeviceMesh of the run's ParallelismConfig (`ctx.parallelism`), or None: what a backend that declares mesh
    dims builds its wrapping on (the same mesh `accelerator.torch_device_mesh` returns)."""
    return device_mesh(ctx.parallelism, ctx.device, ctx.num_processes)


def active_sizes(config: Any) -> dict[str, int]:
    """dimension -> size of the config's dimensions above 1 (all of DIMS read; {} without a config)."""
    if config is None:
        return {}
    return {dim: int(getattr(config, f"{dim}_size")) for dim in DIMS if int(getattr(config, f"{dim}_size")) > 1}


def data_parallel_position(config: Any, rank: int, world: int) -> tuple[int, int]:
    """(data-parallel processes, this rank's index among them): where a data loader shards. Without a config, or
    with data parallelism only, every process is its own dp rank; with tp/cp/sp above 1 (inner mesh dims: the ranks
    of one tp group are consecutive) the processes of one group share an index, and so see the same batches."""
    sizes = active_sizes(config)
    inner = 1
    for dim in ("cp", "sp", "tp"):
        inner *= sizes.get(dim, 1)
    if inner == 1:
        return world, rank
    return world // inner, rank // inner


__all__ = ["active_sizes", "backends_driving", "data_parallel_position", "run_mesh", "check_parallelism", "device_mesh", "mesh_lines", "setting_name", "size_problems",
           "sizes_from_settings"]
