"""OpenMPI and MPICH (Hydra; Intel MPI alike): `mpirun -np N acc launch train.py`.

Read: OMPI_COMM_WORLD_SIZE / _RANK / _LOCAL_RANK / _LOCAL_SIZE (OpenMPI), or PMI_SIZE / PMI_RANK with
MPI_LOCALRANKID / MPI_LOCALNRANKS or PMI_LOCAL_RANK / PMI_LOCAL_SIZE (MPICH, Intel MPI, Cray). The machines are
size / local size; a machine's index is rank // local size, so ranks must be consecutive on each machine
(mpirun's default, --map-by slot). One process per machine: each is a launcher that starts --nproc processes.
More: every MPI process is one training process and acc launch runs it in place.

MPI does not say where rank 0 runs: across machines give MASTER_ADDR (`mpirun -x MASTER_ADDR=<rank 0's host>`)
or --main-process-ip. Port: MASTER_PORT, else one derived from the job's namespace (PMIX_NAMESPACE,
OMPI_MCA_ess_base_jobid), else 29500.
"""

from __future__ import annotations

from typing import Mapping

from acc.cluster import ClusterEnvironment, ClusterError, hookimpl

from .variables import first, integer, port, text_port

ACC_HOOKSPEC_VERSION = 2

FLAVOURS = (
    ("OpenMPI", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
     "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("MPICH/Hydra", "PMI_SIZE", "PMI_RANK", "MPI_LOCALNRANKS", "MPI_LOCALRANKID"),
    ("MPICH (PMI local ranks)", "PMI_SIZE", "PMI_RANK", "PMI_LOCAL_SIZE", "PMI_LOCAL_RANK"),
)


@hookimpl
def acc_cluster_environment(environ: Mapping[str, str], hostname: str) -> ClusterEnvironment | None:
    for flavour, size_var, rank_var, local_size_var, local_rank_var in FLAVOURS:
        if all(environ.get(v) for v in (size_var, rank_var, local_size_var, local_rank_var)):
            return _environment(environ, flavour, size_var, rank_var, local_size_var, local_rank_var)
    return None


def _environment(environ: Mapping[str, str], flavour: str, size_var: str, rank_var: str, local_size_var: str,
                 local_rank_var: str) -> ClusterEnvironment:
    size, rank = integer(environ, size_var, minimum=1), integer(environ, rank_var)
    local_size, local = integer(environ, local_size_var, minimum=1), integer(environ, local_rank_var)
    if size % local_size:
        raise ClusterError(f"{size_var}={size} is not a multiple of {local_size_var}={local_size}: the machines run "
                           "different numbers of processes; give every machine the same (mpirun --map-by "
                           "ppr:N:node)")
    if local != rank % local_size:
        raise ClusterError(f"{rank_var}={rank} with {local_rank_var}={local} and {local_size_var}={local_size}: the "
                           "ranks are not consecutive on each machine, so acc cannot tell the machines' order; map "
                           "them by slot (mpirun --map-by slot, the default)")
    machines, machine = size // local_size, rank // local_size
    label = f"{flavour} (mpirun started {size} process(es), {local_size} per machine)"
    sources = {"num_machines": f"{size_var}={size} / {local_size_var}={local_size}",
               "machine_rank": f"{rank_var}={rank} // {local_size_var}"}
    address, main_port, notes = None, None, ()
    if environ.get("MASTER_ADDR"):
        address = environ["MASTER_ADDR"]
        sources["main_address"] = f"MASTER_ADDR={address}"
    elif machines == 1 and local_size > 1:
        address = "127.0.0.1"
        sources["main_address"] = "one machine: the loopback"
    elif machines > 1:
        notes = (f"{flavour} does not say where rank 0 runs: give its host with mpirun -x MASTER_ADDR=<host> "
                 "(or --main-process-ip)",)
    if machines > 1 or local_size > 1:
        main_port, sources["main_port"] = _port(environ)
        if main_port is None:
            del sources["main_port"]
    if local_size == 1:
        return ClusterEnvironment(label, machines, machine, address, main_port, sources=sources, precedence=30,
                                  notes=notes)
    sources.update(nproc=f"{local_size_var}={local_size}", rank=f"{rank_var}={rank}",
                   local_rank=f"{local_rank_var}={local}")
    return ClusterEnvironment(label, machines, machine, address, main_port, nproc=local_size, rank=rank,
                              local_rank=local, sources=sources, precedence=30, notes=notes)


def _port(environ: Mapping[str, str]) -> tuple[int | None, str]:
    given = port(environ)
    if given is not None:
        return given, f"MASTER_PORT={given}"
    job = first(environ, "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid")
    if job is not None:
        return text_port(job[1]), f"12000 + crc32({job[0]}={job[1]}) mod 20000"
    return None, ""
