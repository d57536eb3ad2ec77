"""`Accelerator(parallelism_config=...)`: Accelerate's ParallelismConfig checked against the run before anything is
prepared (the sizes' product against the processes; each dimension above 1 against the mesh dimensions the
backend declares it drives, `Capabilities.mesh_dims`), and its device mesh built on the run's process group.
"""

from __future__ import annotations

from typing import Any

from acc.errors import AccError

DIMS = ("dp_replicate", "dp_shard", "tp", "cp", "sp")


def check_parallelism(config: Any, num_processes: int, backend: str, capabilities: Any, settings: Any) -> Any:
    """`config` when the run can drive it (None stays None); else an AccError saying what was given, what this run
    has and how to fix it."""
    if config is None:
        return None
    from acc.compat.parallelism_objects import ParallelismConfig

    if not isinstance(config, ParallelismConfig):
        raise TypeError(f"Accelerator(parallelism_config=...): expected an acc.ParallelismConfig (Accelerate's), got "
                        f"{type(config).__name__}")
    sizes = {dim: int(getattr(config, f"{dim}_size")) for dim in DIMS}
    product = " x ".join(f"{dim}_size {size}" for dim, size in sizes.items())
    if config.total_size != num_processes:
        raise AccError(f"ParallelismConfig: {product} = {config.total_size} processes, but this run has "
                       f"{num_processes}: launch {config.total_size} processes (acc launch --nproc "
                       f"{config.total_size}), or give sizes whose product is {num_processes}")
    drives = tuple(capabilities.mesh_dims)
    for dim, size in sizes.items():
        if size > 1 and dim not in drives:
            others = [name for name in backends_driving(dim, settings) if name != backend]
            where = (f"backends that drive {dim}: {', '.join(others)} (acc launch --backend {others[0]})" if others
                     else f"no installed backend drives {dim} yet")
            raise AccError(f"ParallelismConfig({dim}_size={size}): the {backend} backend drives "
                           f"{', '.join(drives) or 'no parallel dimension'}; {where}")
    return config


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


__all__ = ["backends_driving", "check_parallelism", "device_mesh"]
