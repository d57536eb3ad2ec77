"""Real launches on this machine given a scheduler's variables, nothing typed: two `acc launch` as SLURM's srun
starts them (one launcher per node; one task per process), as Kubeflow's pods, as mpirun's processes, under
torchrun; and the checks before the rendezvous failing as one line each. tests/integration/test_slurm.py runs the
same through a real slurmctld and slurmd."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results
from tests.integration.chaos import leftover_processes
from tests.waiting import read_until

pytestmark = pytest.mark.slow

WORKER = str(WORKERS / "machines.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def job_id() -> int:
    """A job id whose derived port (12000 + (job x 100 + step) mod 20000) is free here."""
    while True:
        job = int(uuid.uuid4().int % 10**6)
        port = 12000 + (job * 100) % 20000
        with socket.socket() as s:
            try:
                s.bind(("", port))
                return job
            except OSError:
                continue


def start(tmp_path: Path, variables: dict, out: Path, *extra: str, cmd: list[str] | None = None) -> subprocess.Popen:
    env = clean_env(tmp_path, **variables)
    argv = cmd or [ACC, "launch", "--backend", "ddp", "--output-dir", "", *extra, WORKER, "--out", str(out)]
    return subprocess.Popen(argv, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(procs: list[subprocess.Popen], timeout: float = 120) -> list[str]:
    errs = []
    for proc in procs:
        try:
            _, err = proc.communicate(timeout=timeout)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        errs.append(err)
    for proc, err in zip(procs, errs):
        assert proc.returncode == 0, "\n".join(errs)
    return errs


def slurm(job: int, nodes: int, tasks: int, node: int, procid: int, localid: int) -> dict:
    """The variables srun sets in a task (the names and forms slurm-wlm 22.05 uses, see recorded/)."""
    return {"SLURM_JOB_ID": str(job), "SLURM_JOBID": str(job), "SLURM_STEP_ID": "0", "SLURM_STEPID": "0",
            "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_NNODES": str(nodes), "SLURM_JOB_NUM_NODES": str(nodes),
            "SLURM_STEP_NODELIST": "localhost" + (",acc-node-b" if nodes == 2 else ""),
            "SLURM_STEP_TASKS_PER_NODE": f"{tasks}(x{nodes})" if nodes > 1 else str(tasks),
            "SLURM_NODEID": str(node), "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid),
            "SLURM_NTASKS": str(nodes * tasks)}


def test_slurm_one_launcher_per_node(tmp_path):
    """Node 1's launcher starts first; each knows its machine rank, machine 0's address (the node list's first host)
    and the port (from the job id) from SLURM alone."""
    out, job = tmp_path / "o", job_id()
    started = time.monotonic()
    procs = [start(tmp_path, slurm(job, 2, 1, 1, 1, 0), out)]
    arrived = read_until(procs[0].stderr, "acc launch: before the rendezvous (machine 1 of 2)", timeout=60)
    if "acc launch: before the rendezvous (machine 1 of 2)" not in arrived:
        procs[0].kill()
        pytest.fail(f"node 1's launcher never reached the rendezvous: {arrived + procs[0].communicate()[1]}")
    procs.append(start(tmp_path, slurm(job, 2, 1, 0, 0, 0), out))
    errs = finish(procs)
    errs[0] = arrived + errs[0]
    took = time.monotonic() - started
    results = read_rank_results(out)
    assert [results[r]["machine_rank"] for r in (0, 1)] == [0, 1] and {r["sum"] for r in results.values()} == {2.0}
    port = 12000 + (job * 100) % 20000
    assert ("acc launch: before the rendezvous (machine 1 of 2): main address localhost (from slurm first host of "
            "SLURM_STEP_NODELIST=localhost,acc-node-b) resolved to 127.0.0.1 in ") in errs[0]
    assert f"; 127.0.0.1:{port} answered (" in errs[0] and "2 machine(s), as slurm allocated " \
           "(SLURM_STEP_NUM_NODES=2)" in errs[0]
    assert "acc launch: before the rendezvous (machine 0 of 2)" in errs[1] and f"port {port} free here" in errs[1]
    assert leftover_processes(str(out)) == [], took


def test_slurm_one_task_per_process_each_task_is_the_worker(tmp_path):
    """srun --ntasks-per-node=2: no agent; each acc launch becomes its rank's worker (same pid)."""
    out, job = tmp_path / "o", job_id()
    procs = [start(tmp_path, slurm(job, 1, 2, 0, r, r), out) for r in (1, 0)]
    errs = finish(procs)
    results = read_rank_results(out)
    assert {r: results[r]["pid"] for r in (0, 1)} == {1: procs[0].pid, 0: procs[1].pid}
    assert [results[r]["local_rank"] for r in (0, 1)] == [0, 1] and results[0]["main"]
    assert "before the rendezvous (rank 1 of 2, on machine 0): main address 127.0.0.1 (from slurm one node: the " \
           "loopback)" in errs[0]
    assert leftover_processes(str(out)) == []


def test_kubeflow_pods_with_pet_variables(tmp_path):
    out, port = tmp_path / "o", free_port()
    pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PET_NNODES": "2", "PET_NPROC_PER_NODE": "1",
           "PET_MASTER_ADDR": "127.0.0.1", "PET_MASTER_PORT": str(port)}
    procs = [start(tmp_path, {**pod, "PET_NODE_RANK": str(k)}, out) for k in (1, 0)]
    errs = finish(procs)
    results = read_rank_results(out)
    assert [results[r]["machine_rank"] for r in (0, 1)] == [0, 1] and results[0]["main"]
    assert "main address 127.0.0.1 (from kubeflow PET_MASTER_ADDR=127.0.0.1)" in errs[0]
    assert leftover_processes(str(out)) == []


def test_openmpi_processes_each_is_the_worker(tmp_path):
    out, namespace = tmp_path / "o", f"prterun-test-{uuid.uuid4().hex[:8]}@1"
    mpi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PMIX_NAMESPACE": namespace}
    procs = [start(tmp_path, {**mpi, "OMPI_COMM_WORLD_RANK": str(r), "OMPI_COMM_WORLD_LOCAL_RANK": str(r)}, out)
             for r in (0, 1)]
    finish(procs)
    results = read_rank_results(out)
    assert {r: results[r]["pid"] for r in (0, 1)} == {0: procs[0].pid, 1: procs[1].pid}
    assert leftover_processes(str(out)) == []


def test_under_torchrun_each_worker_runs_in_place_on_the_agents_store(tmp_path):
    """`torchrun --nproc-per-node 2 --no-python acc launch ...`: torchrun's workers are the processes; acc launch in
    each becomes the worker and joins the store torchrun's agent already serves."""
    out = tmp_path / "o"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
           "--no-python", ACC, "launch", "--backend", "ddp", "--output-dir", "", WORKER, "--out", str(out)]
    proc = start(tmp_path, {}, out, cmd=cmd)
    errs = finish([proc])
    results = read_rank_results(out)
    assert sorted(results) == [0, 1] and {r["sum"] for r in results.values()} == {2.0}, errs
    assert "port " in errs[0] and "is served by the launcher that started this process" in errs[0]
    assert leftover_processes(str(out)) == []


def test_a_main_address_that_does_not_resolve_fails_in_one_line_before_any_worker(tmp_path):
    out, job = tmp_path / "o", job_id()
    variables = {**slurm(job, 2, 1, 1, 1, 0), "SLURM_STEP_NODELIST": "acc-no-such-node[1-2]"}
    started = time.monotonic()
    proc = start(tmp_path, variables, out, "--rdzv-timeout", "2")
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 2 and took < 20, (took, err)
    lines = [line for line in err.splitlines() if line.strip()]
    assert lines[0].startswith("acc launch: main address acc-no-such-node1 (from slurm first host of "
                               "SLURM_STEP_NODELIST=acc-no-such-node[1-2]) does not resolve yet"), err
    assert lines[-1].startswith("Error: main address acc-no-such-node1 (from slurm first host of "
                                "SLURM_STEP_NODELIST=acc-no-such-node[1-2]) does not resolve on this machine "
                                "(machine 1 of 2): "), err
    assert len(lines) == 2 and not out.exists()


def test_a_taken_port_on_machine_0_fails_in_one_line(tmp_path):
    out, job = tmp_path / "o", job_id()
    port = 12000 + (job * 100) % 20000
    with socket.socket() as holder:
        holder.bind(("", port))
        holder.listen()
        proc = start(tmp_path, slurm(job, 2, 1, 0, 0, 0), out)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2, err
    assert err.strip() == (f"Error: port {port} (from slurm 12000 + (SLURM_JOB_ID={job} x 100 + SLURM_STEP_ID=0) mod "
                           "20000) is already in use on this machine (Address already in use); choose a free "
                           "--main-process-port, or on one machine leave it out and a free port is picked")
    assert not out.exists()


def test_contradicting_the_allocation_is_refused_before_anything_starts(tmp_path):
    out, job = tmp_path / "o", job_id()
    proc = start(tmp_path, slurm(job, 2, 1, 0, 0, 0), out, "--num-machines", "4")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 2 and "num_machines 4 (from flag --num-machines) contradicts SLURM job " in err
    assert ": 2 (from slurm SLURM_STEP_NUM_NODES=2)" in err and not out.exists()
