"""ZeRO-3's fp32 master partition shares the parameters' partition when the two would be equal copies.

DeepSpeed's stage-3 optimizer keeps a master copy of each sub-group's parameter partition for the optimizer to update,
and means to skip it when the parameters already are in the master dtype on the optimizer's device (fp32 training).
Its test compares the partition's `torch.device` with the accelerator's device *name*, a string ('cpu', 'cuda:0'),
which never compares equal, so fp32 training keeps two equal copies of every partition (on the bench model, 100 MB
per rank of 2). Here the master becomes the parameter partition itself: the optimizer then updates the parameters in
place, and DeepSpeed's copy of the master into the parameters after each step copies a tensor onto itself.
"""

from __future__ import annotations

from typing import Any


def share_fp32_master(optimizer: Any) -> None:
    """Point each fp32 master partition of a ZeRO-3 optimizer at its parameter partition where they have the same
    dtype, device and size and nothing swaps or offloads them (on the bench model this frees 100 MB per rank).
    Other optimizers (ZeRO-0 to 2, mixed precision, offload, NVMe) are left as they are."""
    masters = getattr(optimizer, "fp32_partitioned_groups_flat", None)
    partitions = getattr(optimizer, "fp16_partitioned_groups_flat", None)
    if masters is None or partitions is None or getattr(optimizer, "offload_optimizer", True):
        return
    swappable = getattr(optimizer, "_swappable_optimizer_subgroup", lambda i: True)
    for i, (master, partition) in enumerate(zip(masters, partitions)):
        if (partition is None or master is partition or swappable(i) or master.dtype != partition.dtype
                or master.device != partition.device or master.numel() != partition.numel()
                or master.untyped_storage().data_ptr() == partition.untyped_storage().data_ptr()):
            continue
        partition.copy_(master.detach())  # the master is what the next step updates: keep its values exactly
        master.data = partition.data.view_as(master)
