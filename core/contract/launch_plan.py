"""A launch plan is data: which engine starts the processes, how many, where they meet. Torch-free."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

DEFAULT_PORT = 29500  # where machine 0's rendezvous store listens when nobody says (torch's default)

# engine name -> what starts the processes (the kernel owns one executor per engine)
ENGINES = {
    "process": "one plain Python process",
    "elastic": "torch's elastic agent (torch.distributed.run)",
    "pjrt": "torch_xla's PJRT launcher",
    "task": "this process, one of the run's processes that a scheduler started (no agent: it becomes the worker)",
}


@dataclass(frozen=True)
class Rendezvous:
    """Where the processes of a multi-process run meet."""

    backend: str = "c10d"
    endpoint: str | None = None  # host:port; None = the executor picks a free local port
    run_id: str | None = None
    timeout: float = 900.0  # seconds every machine has to join (the rdzv_timeout setting)
    why: str = ""  # why this backend (shown by the dry run)
    listen: str | None = None  # the address the store listens on (machine 0); None: not known yet (see listen.py)
    listen_why: str = ""  # why there, in words

    def main_machine(self, nproc: int) -> str:
        """Which machine holds the main process (global rank 0), and why, in words."""
        if self.backend == "static":
            return (f"machine 0 (the static rendezvous gives machine k the global ranks k*{nproc}..k*{nproc}+"
                    f"{nproc - 1}, whatever the order the machines arrive in)")
        return (f"decided by the {self.backend} rendezvous when every machine has joined ({self.backend} orders the "
                "machines by host name, then launcher process id; not by --machine-rank): each launcher says at "
                "start which machine holds it; --rdzv-backend static keeps it on machine 0")


@dataclass
class LaunchPlan:
    """What `acc_launch_plan` returns.

    `engine` names one of ENGINES. `device` describes, in words, what each process will compute on.
    `env` is added to every worker's environment. `notes` are shown by `acc launch --dry-run`.
    """

    engine: str
    nproc_per_machine: int = 1
    num_machines: int = 1
    machine_rank: int = 0
    device: str = "cpu"
    rendezvous: Rendezvous | None = None
    max_restarts: int = 0
    env: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def world_size(self) -> int:
        return self.nproc_per_machine * self.num_machines

    def problems(self) -> list[str]:
        """Ways this plan is malformed (empty when well formed)."""
        out = []
        if self.engine not in ENGINES:
            out.append(f"engine {self.engine!r} is unknown; valid engines: {', '.join(ENGINES)}")
        if self.nproc_per_machine < 1 or self.num_machines < 1:
            out.append(f"process counts must be >= 1 (nproc_per_machine={self.nproc_per_machine}, "
                       f"num_machines={self.num_machines})")
        if not 0 <= self.machine_rank < max(self.num_machines, 1):
            out.append(f"machine_rank {self.machine_rank} is outside 0..{self.num_machines - 1}")
        if self.engine == "process" and self.world_size != 1:
            out.append(f"the 'process' engine starts one process, but the plan asks for {self.world_size}")
        if not all(isinstance(k, str) and isinstance(v, str) for k, v in self.env.items()):
            out.append("plan env must map strings to strings")
        return out


@dataclass(frozen=True)
class Target:
    """What each worker runs: a script path or a module (`-m`), with its own arguments; with `no_python`, a
    program run as it is (not through Python)."""

    program: str
    args: tuple[str, ...] = ()
    is_module: bool = False
    no_python: bool = False

    def argv(self, python: str) -> list[str]:
        if self.no_python:
            return [self.program, *self.args]
        return [python, "-m", self.program, *self.args] if self.is_module else [python, self.program, *self.args]

    def __str__(self) -> str:
        head = ["-m", self.program] if self.is_module else [self.program]
        return shlex.join([*head, *self.args])

    def command(self) -> str:
        """The command line each worker runs, as shown to the user."""
        return str(self) if self.no_python else f"python {self}"


