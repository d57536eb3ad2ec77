"""A launch plan is data: which engine starts the processes, how many, where they meet. Torch-free."""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Any, Mapping

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


DEFAULT_MULTI_MACHINE_PORT = 29500


def elastic_plan(settings: Mapping[str, Any], device: str, notes: list[str] | None = None) -> LaunchPlan:
    """The plan every backend that starts workers through torch's elastic agent returns (ddp, fsdp, ...).

    One machine: the launcher's store on loopback (a free port unless main_process_port names one, so concurrent runs
    never collide), met through the static rendezvous. Several machines: everyone meets at
    main_process_ip:main_process_port (29500 by default), through the static rendezvous unless another was chosen
    (machine k then hosts global ranks k*nproc..); machine 0's store listens on the address that reaches
    main_process_ip (or listen_address). Where everything listens: listen.py.
    """
    import os

    from acc.launch import listen as listening

    machines = settings["num_machines"]
    ip, port = settings["main_process_ip"], settings["main_process_port"]
    backend, why = settings["rdzv_backend"], ""
    address, address_why = listening.choose(settings)
    if machines == 1:
        # the launcher's own store, bound where `address` says (loopback by default), shared by the agent and the
        # workers through the static rendezvous: torch's c10d would open a second store on every interface
        endpoint = listening.host_port(listening.connect_host(address or listening.LOOPBACK), str(port or 0))
        backend, why = "static", ("one machine: the agent and the workers share the launcher's store" +
                                  (f"; rdzv_backend {settings['rdzv_backend']} applies across machines"
                                   if settings["rdzv_backend"] != "static" else ""))
    else:
        endpoint = f"{ip}:{port or DEFAULT_MULTI_MACHINE_PORT}"
        source = settings.source("rdzv_backend") if hasattr(settings, "source") else "default"
        if source == "default":
            # as Accelerate's default: machine k hosts ranks k*n.., so the main process (which writes checkpoints,
            # prints and logs) is on machine 0 whatever the order the machines join in
            backend, why = "static", ("the default across machines: machine k hosts global ranks k*nproc.., so the "
                                      "main process runs on machine 0 (--rdzv-backend c10d for torch's dynamic "
                                      "rendezvous)")
    return LaunchPlan(
        engine="elastic",
        nproc_per_machine=settings["nproc"],
        num_machines=machines,
        machine_rank=settings["machine_rank"],
        device=device,
        rendezvous=Rendezvous(backend=backend, endpoint=endpoint, timeout=float(settings.get("rdzv_timeout", 900.0)),
                              why=why, listen=address, listen_why=address_why),
        max_restarts=settings["max_restarts"],
        env=listening.worker_environment(settings, address, os.environ),
        notes=list(notes or []),
    )
