"""The launch plans acc builds for backends: `elastic_plan` (torch's elastic agent on every machine, what ddp,
fsdp, deepspeed and most third-party backends return from `acc_launch_plan`) and `task_plan` (one process that a
scheduler started itself: it becomes the worker). Torch-free.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping

from acc.contract.cluster import ClusterEnvironment
from acc.contract.launch_plan import DEFAULT_PORT, LaunchPlan, Rendezvous
from acc.errors import LaunchError


def elastic_plan(settings: Mapping[str, Any], device: str, notes: list[str] | None = None) -> LaunchPlan:
    """The plan every backend that starts workers through torch's elastic agent returns (ddp, fsdp, ...).

    One machine: the launcher's store on loopback (a free port unless main_process_port names one, so concurrent runs
    never collide), met through the static rendezvous. Several machines: everyone meets at
    main_process_ip:main_process_port (29500 by default), through the static rendezvous unless another was chosen
    (machine k then hosts global ranks k*nproc..); machine 0's store listens on the address that reaches
    main_process_ip (or listen_address). Where everything listens: listen.py.
    """
    import os

    from acc.launcher import listen as listening

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
        endpoint = f"{ip}:{port or DEFAULT_PORT}"
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


def task_plan(plan: "LaunchPlan", env: ClusterEnvironment, settings: Any) -> "LaunchPlan":
    """The plan for one process the scheduler started (one task per process): engine `task`, this process becomes
    the worker, with torchrun's variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...) from the scheduler."""
    from acc.contract.launch_plan import Rendezvous

    if plan.engine != "elastic":
        raise LaunchError(f"the {settings['backend']} backend starts its processes with the '{plan.engine}' engine, "
                          f"which cannot run as one process per {env.name} task ({env.label}); start one task per "
                          "machine so that acc launch starts the processes itself")
    nproc, machines = settings["nproc"], settings["num_machines"]
    address = settings["main_process_ip"] or "127.0.0.1"
    port = settings["main_process_port"] or DEFAULT_PORT
    variables = {
        "RANK": env.rank, "LOCAL_RANK": env.local_rank, "WORLD_SIZE": nproc * machines, "LOCAL_WORLD_SIZE": nproc,
        "GROUP_RANK": settings["machine_rank"], "GROUP_WORLD_SIZE": machines, "ROLE_RANK": env.rank,
        "ROLE_WORLD_SIZE": nproc * machines, "ROLE_NAME": "default", "MASTER_ADDR": address, "MASTER_PORT": port,
    }
    why = (f"{env.name} started every process: each joins torch's process group at MASTER_ADDR:MASTER_PORT, "
           "which rank 0 hosts" + (" (the launcher that started it already serves the store there)"
                                   if env.store_ready else ""))
    return replace(plan, engine="task", rendezvous=Rendezvous(backend="env", endpoint=f"{address}:{port}",
                                                              timeout=float(settings["rdzv_timeout"]), why=why),
                   env={**plan.env, **{k: str(v) for k, v in variables.items()}}, max_restarts=0)
