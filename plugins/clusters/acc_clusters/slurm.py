"""SLURM: `srun acc launch train.py`, one launcher per node or one task per process.

Read (a job step's own variables first, srun sets them; the job's otherwise):
- machines: SLURM_STEP_NUM_NODES / SLURM_NNODES / SLURM_JOB_NUM_NODES; this machine: SLURM_NODEID
- machine 0's address: the first host of SLURM_STEP_NODELIST / SLURM_NODELIST / SLURM_JOB_NODELIST, expanded as
  `scontrol show hostnames` does (MASTER_ADDR, when set, wins)
- port: MASTER_PORT, else 12000 + (SLURM_JOB_ID x 100 + SLURM_STEP_ID) mod 20000, the same on every node
- tasks per node: SLURM_STEP_TASKS_PER_NODE / SLURM_TASKS_PER_NODE. One task per node: each is a launcher that
  starts --nproc processes. More: every task is one training process (rank SLURM_PROCID, local rank SLURM_LOCALID)
  and acc launch runs it in place.

`acc launch` in the batch script itself (no SLURM_STEP_ID) runs on the first node only: across several nodes that
is refused, since the other nodes would never join.
"""

from __future__ import annotations

from typing import Mapping

from acc.cluster import ClusterEnvironment, ClusterError, hookimpl

from . import hostlist
from .variables import first, integer, job_port, port

ACC_HOOKSPEC_VERSION = 2


@hookimpl
def acc_cluster_environment(environ: Mapping[str, str], hostname: str) -> ClusterEnvironment | None:
    job_var = first(environ, "SLURM_JOB_ID", "SLURM_JOBID")
    if job_var is None:
        return None
    job = integer(environ, job_var[0])
    step_var = first(environ, "SLURM_STEP_ID", "SLURM_STEPID")
    if step_var is None:
        return _outside_srun(environ, job)
    step = integer(environ, step_var[0])
    label = f"SLURM job {job}, step {step}"
    nodes_var = _need(environ, label, "SLURM_STEP_NUM_NODES", "SLURM_NNODES", "SLURM_JOB_NUM_NODES")
    nodes = integer(environ, nodes_var, minimum=1)
    list_var = _need(environ, label, "SLURM_STEP_NODELIST", "SLURM_NODELIST", "SLURM_JOB_NODELIST")
    listed = hostlist.count(environ[list_var])
    if listed != nodes:
        raise ClusterError(f"{list_var}={environ[list_var]!r} names {listed} host(s) but {nodes_var}={nodes}")
    tasks_var = _need(environ, label, "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE")
    runs = hostlist.tasks_per_node(environ[tasks_var])
    if sum(n for _, n in runs) != nodes:
        raise ClusterError(f"{tasks_var}={environ[tasks_var]!r} counts {sum(n for _, n in runs)} node(s) but "
                           f"{nodes_var}={nodes}")
    if len({tasks for tasks, _ in runs}) > 1:
        raise ClusterError(f"the nodes run different numbers of tasks ({tasks_var}={environ[tasks_var]!r}); acc "
                           "starts the same number of processes on every machine: srun --ntasks-per-node=N "
                           "(1 for one launcher per node)")
    tasks = runs[0][0]
    node = integer(environ, "SLURM_NODEID")
    sources = {"num_machines": f"{nodes_var}={nodes}", "machine_rank": f"SLURM_NODEID={node}"}
    address, address_from = _address(environ, list_var, nodes, tasks)
    main_port, port_from = _port(environ, job, step, nodes, tasks)
    if address is not None:
        sources["main_address"] = address_from
    if main_port is not None:
        sources["main_port"] = port_from
    if tasks == 1:
        return ClusterEnvironment(label, nodes, node, address, main_port, sources=sources, precedence=10)
    rank, local = integer(environ, "SLURM_PROCID"), integer(environ, "SLURM_LOCALID")
    sources.update(nproc=f"{tasks_var}={environ[tasks_var]}", rank=f"SLURM_PROCID={rank}",
                   local_rank=f"SLURM_LOCALID={local}")
    return ClusterEnvironment(label, nodes, node, address, main_port, nproc=tasks, rank=rank, local_rank=local,
                              sources=sources, precedence=10, notes=(KILL_NOTE,))


KILL_NOTE = ("one task per process: a task that fails stops the others at once only with srun --kill-on-bad-exit=1 "
             "(or KillOnBadExit=1 in slurm.conf); otherwise they wait for it up to --timeout")


def _need(environ: Mapping[str, str], label: str, *names: str) -> str:
    found = first(environ, *names)
    if found is None:
        raise ClusterError(f"{label} sets none of {', '.join(names)}")
    return found[0]


def _outside_srun(environ: Mapping[str, str], job: int) -> ClusterEnvironment:
    """acc launch in the batch script (or an salloc shell): one machine only."""
    nodes_var = first(environ, "SLURM_JOB_NUM_NODES", "SLURM_NNODES")
    nodes = integer(environ, nodes_var[0], minimum=1) if nodes_var else 1
    if nodes > 1:
        raise ClusterError(
            f"acc launch runs outside srun (no SLURM_STEP_ID) in SLURM job {job} of {nodes} nodes "
            f"({nodes_var[0]}={nodes}): it would run on this node only and the others would never join. Start it "
            "on every node: srun --ntasks-per-node=1 acc launch ... (one launcher per node), or srun acc launch ... "
            "with one task per process")
    where = f"{nodes_var[0]}=1" if nodes_var else "a job of one node"
    return ClusterEnvironment(f"SLURM job {job} (outside srun, one node)", 1, 0,
                              sources={"num_machines": where, "machine_rank": where}, precedence=10)


def _address(environ: Mapping[str, str], list_var: str, nodes: int, tasks: int) -> tuple[str | None, str]:
    if environ.get("MASTER_ADDR"):
        return environ["MASTER_ADDR"], f"MASTER_ADDR={environ['MASTER_ADDR']}"
    if nodes == 1:  # one machine: its processes meet on the loopback (one launcher needs no address at all)
        return (None, "") if tasks == 1 else ("127.0.0.1", "one node: the loopback")
    return hostlist.first_host(environ[list_var]), f"first host of {list_var}={environ[list_var]}"


def _port(environ: Mapping[str, str], job: int, step: int, nodes: int, tasks: int) -> tuple[int | None, str]:
    given = port(environ)
    if given is not None:
        return given, f"MASTER_PORT={given}"
    if nodes == 1 and tasks == 1:
        return None, ""  # one launcher alone picks a free port
    return job_port(job, step), f"12000 + (SLURM_JOB_ID={job} x 100 + SLURM_STEP_ID={step}) mod 20000"
