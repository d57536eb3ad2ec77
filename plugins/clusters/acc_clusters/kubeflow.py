"""Kubeflow (PyTorchJob, TrainJob) and torchrun-style variables, as each sets them.

- PET_NNODES / PET_NODE_RANK / PET_NPROC_PER_NODE / PET_MASTER_ADDR / PET_MASTER_PORT (Kubeflow Trainer's TrainJob,
  and the training-operator's PyTorchJob since it took nprocPerNode): one launcher per pod. PET_NPROC_PER_NODE fixes
  the processes per pod when it is a number ("auto", "cpu", "gpu": acc decides). MASTER_ADDR/MASTER_PORT fill in
  when the PET_ ones are missing; RANK is the pod's index when PET_NODE_RANK is missing. An elastic range
  (PET_NNODES=1:4) is refused: acc runs a fixed number of machines.
- MASTER_ADDR, MASTER_PORT, WORLD_SIZE and RANK in a Kubernetes pod (KUBERNETES_SERVICE_HOST), without PET_NNODES:
  the older PyTorchJob operator, where WORLD_SIZE counts pods and RANK is the pod's index (master 0).
- A process torchrun started (TORCHELASTIC_RUN_ID, with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR,
  MASTER_PORT): every variable counts processes; this one is one of them (`torchrun ... acc launch train.py`), and
  torchrun's agent already serves the store at MASTER_ADDR:MASTER_PORT.
"""

from __future__ import annotations

from typing import Mapping

from acc.cluster import ClusterEnvironment, ClusterError, hookimpl

from .variables import first, integer, port

ACC_HOOKSPEC_VERSION = 2


@hookimpl
def acc_cluster_environment(environ: Mapping[str, str], hostname: str) -> ClusterEnvironment | None:
    if environ.get("TORCHELASTIC_RUN_ID") and all(environ.get(v) for v in _TORCHRUN):
        return _torchrun_worker(environ)
    if environ.get("PET_NNODES"):
        return _pet(environ)
    if environ.get("KUBERNETES_SERVICE_HOST") and all(environ.get(v) for v in ("MASTER_ADDR", "WORLD_SIZE", "RANK")):
        return _pytorchjob_pods(environ)
    return None


_TORCHRUN = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def _pet(environ: Mapping[str, str]) -> ClusterEnvironment:
    raw = environ["PET_NNODES"].strip()
    if ":" in raw:
        low, _, high = raw.partition(":")
        if low != high:
            raise ClusterError(f"PET_NNODES={raw!r} is an elastic range; acc runs a fixed number of machines: give "
                               "the job's elasticPolicy minReplicas = maxReplicas (or no elasticPolicy)")
        environ = {**environ, "PET_NNODES": low}
    machines = integer(environ, "PET_NNODES", minimum=1)
    rank_var = first(environ, "PET_NODE_RANK", "RANK")
    if rank_var is None:
        raise ClusterError(f"PET_NNODES={raw} but neither PET_NODE_RANK nor RANK says which pod this is")
    rank = integer(environ, rank_var[0])
    sources = {"num_machines": f"PET_NNODES={raw}", "machine_rank": f"{rank_var[0]}={rank}"}
    address = first(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
    port_var = first(environ, "PET_MASTER_PORT", "MASTER_PORT")
    main_port = port(environ, port_var[0]) if port_var else None
    if address and machines > 1:
        sources["main_address"] = f"{address[0]}={address[1]}"
    if port_var and machines > 1:
        sources["main_port"] = f"{port_var[0]}={main_port}"
    nproc = None
    per_pod = environ.get("PET_NPROC_PER_NODE", "").strip()
    if per_pod.isdigit():
        nproc = integer(environ, "PET_NPROC_PER_NODE", minimum=1)
        sources["nproc"] = f"PET_NPROC_PER_NODE={nproc}"
    label = "Kubeflow job (PET_* variables)"
    return ClusterEnvironment(label, machines, rank, address[1] if address and machines > 1 else None,
                              main_port if machines > 1 else None, nproc=nproc, sources=sources, precedence=20)


def _pytorchjob_pods(environ: Mapping[str, str]) -> ClusterEnvironment:
    machines = integer(environ, "WORLD_SIZE", minimum=1)
    rank = integer(environ, "RANK")
    sources = {"num_machines": f"WORLD_SIZE={machines} (pods)", "machine_rank": f"RANK={rank} (the pod's index)"}
    address, main_port = None, None
    if machines > 1:
        address = environ["MASTER_ADDR"]
        sources["main_address"] = f"MASTER_ADDR={address}"
        main_port = port(environ)
        if main_port is not None:
            sources["main_port"] = f"MASTER_PORT={main_port}"
    return ClusterEnvironment("Kubeflow PyTorchJob (MASTER_ADDR, WORLD_SIZE and RANK count pods)", machines, rank,
                              address, main_port, sources=sources, precedence=20)


def _torchrun_worker(environ: Mapping[str, str]) -> ClusterEnvironment:
    world = integer(environ, "WORLD_SIZE", minimum=1)
    local_world = integer(environ, "LOCAL_WORLD_SIZE", minimum=1)
    if world % local_world:
        raise ClusterError(f"WORLD_SIZE={world} is not a multiple of LOCAL_WORLD_SIZE={local_world}: the machines run "
                           "different numbers of processes")
    rank, local = integer(environ, "RANK"), integer(environ, "LOCAL_RANK")
    machine_var = "GROUP_RANK" if environ.get("GROUP_RANK") else None
    machine = integer(environ, machine_var) if machine_var else rank // local_world
    main_port = port(environ)
    sources = {"num_machines": f"WORLD_SIZE={world} / LOCAL_WORLD_SIZE={local_world}",
               "machine_rank": f"GROUP_RANK={machine}" if machine_var else f"RANK={rank} // LOCAL_WORLD_SIZE",
               "main_address": f"MASTER_ADDR={environ['MASTER_ADDR']}", "main_port": f"MASTER_PORT={main_port}",
               "nproc": f"LOCAL_WORLD_SIZE={local_world}", "rank": f"RANK={rank}", "local_rank": f"LOCAL_RANK={local}"}
    return ClusterEnvironment(f"a process torchrun started (TORCHELASTIC_RUN_ID={environ['TORCHELASTIC_RUN_ID']})",
                              world // local_world, machine, environ["MASTER_ADDR"], main_port, nproc=local_world,
                              rank=rank, local_rank=local,
                              store_ready=environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True", sources=sources,
                              precedence=30)
