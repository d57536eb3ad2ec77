"""IBM Spectrum LSF: one `acc launch` per host of the job (e.g. `blaunch -z "$hosts" acc launch train.py`).

Read: LSB_JOBID; the job's hosts from LSB_MCPU_HOSTS ("hostA 4 hostB 4"), else LSB_HOSTS (one name per slot), in
order, each once. Machines: the hosts; this machine: the index of this host's name among them; machine 0's
address: the first host (MASTER_ADDR, when set, wins); port: MASTER_PORT, else 12000 + (LSB_JOBID x 100) mod 20000.
"""

from __future__ import annotations

from typing import Mapping

from acc.cluster import ClusterEnvironment, ClusterError, hookimpl

from .variables import integer, job_port, port

ACC_HOOKSPEC_VERSION = 2


@hookimpl
def acc_cluster_environment(environ: Mapping[str, str], hostname: str) -> ClusterEnvironment | None:
    if not environ.get("LSB_JOBID"):
        return None
    job = integer(environ, "LSB_JOBID")
    hosts, where = _hosts(environ)
    machine = _index(hostname, hosts, where)
    label = f"LSF job {job}"
    sources = {"num_machines": f"{len(hosts)} host(s) in {where}", "machine_rank": f"this host ({hostname}) in {where}"}
    if len(hosts) == 1:
        return ClusterEnvironment(label, 1, 0, sources=sources, precedence=10)
    if environ.get("MASTER_ADDR"):
        address, sources["main_address"] = environ["MASTER_ADDR"], f"MASTER_ADDR={environ['MASTER_ADDR']}"
    else:
        address, sources["main_address"] = hosts[0], f"first host of {where}"
    main_port = port(environ)
    if main_port is not None:
        sources["main_port"] = f"MASTER_PORT={main_port}"
    else:
        main_port, sources["main_port"] = job_port(job), f"12000 + (LSB_JOBID={job} x 100) mod 20000"
    return ClusterEnvironment(label, len(hosts), machine, address, main_port, sources=sources, precedence=10,
                              notes=("LSF starts one acc launch per host only when asked to: blaunch -z \"<hosts>\" "
                                     "acc launch ... (in the batch script alone, acc launch runs on the first host)",))


def _hosts(environ: Mapping[str, str]) -> tuple[list[str], str]:
    """The job's hosts in order, each once, and the variable they came from."""
    if environ.get("LSB_MCPU_HOSTS"):
        words = environ["LSB_MCPU_HOSTS"].split()
        if len(words) % 2 or not all(w.isdigit() for w in words[1::2]):
            raise ClusterError(f"LSB_MCPU_HOSTS={environ['LSB_MCPU_HOSTS']!r} is not 'host slots host slots ...'")
        names, where = words[0::2], f"LSB_MCPU_HOSTS={environ['LSB_MCPU_HOSTS']}"
    elif environ.get("LSB_HOSTS"):
        names, where = environ["LSB_HOSTS"].split(), f"LSB_HOSTS={environ['LSB_HOSTS']}"
    else:
        raise ClusterError("LSB_JOBID is set but neither LSB_MCPU_HOSTS nor LSB_HOSTS lists the job's hosts")
    return list(dict.fromkeys(names)), where


def _index(hostname: str, hosts: list[str], where: str) -> int:
    short = hostname.split(".")[0]
    for i, host in enumerate(hosts):
        if host == hostname or host.split(".")[0] == short:
            return i
    raise ClusterError(f"this machine ({hostname}) is not among the job's hosts ({where}); run acc launch on the "
                       "job's hosts (blaunch)")
