"""A scheduler's view of a launch: what a cluster-environment plugin answers `acc_cluster_environment` with.

Torch-free data (the contract); asking the plugins is `acc.assembly.choose.clusters`, and what a plugin author imports is
`acc.assembly.clusters`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from acc.errors import ConfigError

CLUSTER_GROUP = "acc.clusters"  # the entry-point group of cluster-environment plugins


class ClusterError(ConfigError):
    """The scheduler's variables are there but cannot describe a launch (the message names them and the fix)."""


@dataclass(frozen=True)
class ClusterEnvironment:
    """A scheduler's facts about this launch, as one cluster-environment plugin read them.

    `nproc` (processes per machine) is set only where the scheduler fixes it. `rank` and `local_rank` are set
    only when the scheduler started every training process itself (one task per process): `acc launch` then
    becomes that one worker instead of starting `nproc` of its own. `store_ready`: the launcher that started
    this process already serves the rendezvous store at main_address:main_port (torchrun's agent).
    `sources` maps each field to the variables it came from, in words (`"SLURM_NNODES=4"`). Between several
    active environments the highest `precedence` wins (the launcher that started this process directly
    describes it best: mpirun inside a SLURM job, torchrun inside a Kubernetes pod).
    """

    label: str
    num_machines: int
    machine_rank: int
    main_address: str | None = None
    main_port: int | None = None
    nproc: int | None = None
    rank: int | None = None
    local_rank: int | None = None
    store_ready: bool = False
    sources: Mapping[str, str] = field(default_factory=dict)
    precedence: int = 10
    notes: tuple[str, ...] = ()
    name: str = ""  # the plugin's name, filled in by the kernel
    also_active: tuple[str, ...] = ()  # other active environments, not used (filled in by the kernel)

    @property
    def per_process(self) -> bool:
        """True when the scheduler started every training process (this one is one of them)."""
        return self.rank is not None

    def source(self, name: str) -> str:
        """Where field `name` came from: the plugin's name and the variables (`slurm SLURM_NNODES=4`)."""
        detail = self.sources.get(name, "")
        return f"{self.name} {detail}".strip() if self.name else detail

    def problems(self) -> list[str]:
        """Ways this answer is malformed (empty when well formed)."""
        out = []
        if self.num_machines < 1:
            out.append(f"num_machines {self.num_machines} ({self.sources.get('num_machines', '?')}) is below 1")
        elif not 0 <= self.machine_rank < self.num_machines:
            out.append(f"machine_rank {self.machine_rank} ({self.sources.get('machine_rank', '?')}) is outside "
                       f"0..{self.num_machines - 1}")
        if self.nproc is not None and self.nproc < 1:
            out.append(f"nproc {self.nproc} ({self.sources.get('nproc', '?')}) is below 1")
        if self.main_port is not None and not 1 <= self.main_port <= 65535:
            out.append(f"main_port {self.main_port} ({self.sources.get('main_port', '?')}) is outside 1..65535")
        if self.per_process:
            if self.nproc is None or self.local_rank is None or self.rank is None:
                out.append("an environment that started every process must give rank, nproc and local_rank too")
            else:
                world = self.num_machines * self.nproc
                if not 0 <= self.rank < world:
                    out.append(f"rank {self.rank} ({self.sources.get('rank', '?')}) is outside 0..{world - 1} "
                               f"({self.num_machines} machines x {self.nproc} processes)")
                if not 0 <= self.local_rank < self.nproc:
                    out.append(f"local_rank {self.local_rank} ({self.sources.get('local_rank', '?')}) is outside "
                               f"0..{self.nproc - 1}")
        return out

    def describe(self) -> str:
        """One line for the dry run."""
        head = f"{self.name}: {self.label}: {self.num_machines} machine(s), this is machine {self.machine_rank}"
        if self.per_process:
            mode = (f"one process per task: this process is rank {self.rank} (local rank {self.local_rank}) of "
                    f"{self.num_machines * (self.nproc or 1)}; acc launch runs it in place (no agent)")
        else:
            mode = "one launcher per machine: acc launch starts nproc processes here"
        extra = f"; also active, not used: {', '.join(self.also_active)}" if self.also_active else ""
        return f"{head}; {mode}{extra}"


__all__ = ["CLUSTER_GROUP", "ClusterEnvironment", "ClusterError"]
