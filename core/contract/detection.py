"""A backend's answer to `acc_detect`: how well it fits this machine. Choosing among the answers is
`acc.assembly.detection`. Torch-free."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Detection:
    """A backend's answer to `acc_detect`: how well it fits this machine (higher is better), how many
    processes it would start per machine, and why, in a few words."""

    backend: str
    score: int
    nproc: int = 1
    reason: str = ""
