"""A real SLURM cluster on this machine: Debian's slurm-wlm (installed here by the test when missing), one slurmctld
and two slurmd (two nodes, one per name that resolves to this machine), jobs submitted with `sbatch --wait` whose
`srun acc launch --backend ddp` runs 2 processes: one launcher per node, and one task per process.

If the sandbox cannot run the daemons, the tests are skipped with the daemons' own error lines as the reason.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results
from tests.integration.chaos import leftover_processes
from tests.integration.sockets import listening_sockets
from tests.waiting import wait_until

pytestmark = pytest.mark.slow

DAEMONS = ("slurmctld", "slurmd", "sbatch", "srun", "sinfo", "scancel", "scontrol")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def install_slurm() -> str:
    """Install slurm-wlm with apt-get when a command is missing; return what was done, for the report."""
    missing = [c for c in DAEMONS if shutil.which(c) is None and not Path("/usr/sbin", c).exists()]
    if not missing:
        return "slurm-wlm was installed already"
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"slurm-wlm is not installed ({', '.join(missing)} missing) and cannot be installed here: "
                    + ("not root" if os.geteuid() != 0 else "no apt-get"))
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    started = time.monotonic()
    for cmd in (["apt-get", "update", "-q"],
                ["apt-get", "install", "-y", "-q", "--no-install-recommends", "slurm-wlm"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, f"`{' '.join(cmd)}` failed ({proc.returncode}):\n{proc.stdout[-3000:]}" \
                                     f"\n{proc.stderr[-3000:]}"
    return f"slurm-wlm installed with apt-get in {time.monotonic() - started:.1f} s"


def node_names() -> list[str]:
    """Names that resolve to this machine, for the nodes (a SLURM node list names hosts and acc resolves the first).
    Not "localhost": slurm reads NodeName=localhost as this machine's host name."""
    candidates = [socket.gethostname()]
    try:
        for line in Path("/etc/hosts").read_text().splitlines():
            fields = line.split("#")[0].split()
            if len(fields) >= 2 and fields[0].startswith("127."):
                candidates += fields[1:]
    except OSError:
        pass
    names = []
    for name in candidates:
        if name.startswith(("localhost", "ip6-")) or name in names or not name.replace("-", "").isalnum():
            continue
        try:
            if socket.gethostbyname(name).startswith("127."):
                names.append(name)
        except OSError:
            continue
    if not names:
        pytest.skip("no name other than localhost resolves to this machine, so no SLURM node can be named here")
    return sorted(names)[:2]


CONF = """\
ClusterName=acctest
SlurmctldHost={controller}(127.0.0.1)
SlurmctldPort={ctld_port}
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/slurmctld.log
SlurmdLogFile={root}/slurmd-%n.log
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/linear
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
{nodes}
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


def _stop(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in procs:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A running cluster of one or two nodes: (environment for its commands, node names, its directory, how it was
    installed)."""
    how = install_slurm()
    names = node_names()
    if os.geteuid() != 0:
        pytest.skip("the test cluster runs its daemons as root (SlurmUser=root) and this is not root")
    root = tmp_path_factory.mktemp("slurm")
    for sub in ("state", *(f"spool/{n}" for n in names)):
        (root / sub).mkdir(parents=True)
    conf, ctld_port = root / "slurm.conf", free_port()
    nodes = "\n".join(f"NodeName={n} NodeAddr=127.0.0.1 Port={free_port()} CPUs=2 State=UNKNOWN" for n in names)
    conf.write_text(CONF.format(controller=socket.gethostname(), ctld_port=ctld_port, nodes=nodes, root=root))
    env = clean_env(root, SLURM_CONF=str(conf), PATH=f"{os.environ.get('PATH', '')}:/usr/sbin")
    sbin = lambda c: shutil.which(c, path=env["PATH"])  # noqa: E731
    logs = {n: root / f"{n}.out" for n in ("slurmctld", *names)}
    procs = [subprocess.Popen([sbin("slurmctld"), "-D", "-i", "-f", str(conf)], env=env,
                              stdout=logs["slurmctld"].open("w"), stderr=subprocess.STDOUT)]
    # the slurmds register with slurmctld once it listens (no event says so: its sockets are checked every 50 ms)
    wait_until(lambda: any(s.port == ctld_port for s in listening_sockets(procs[0].pid)), timeout=30, ended=procs)
    for name in names:
        procs.append(subprocess.Popen([sbin("slurmd"), "-D", "-N", name, "-f", str(conf)], env=env,
                                      stdout=logs[name].open("w"), stderr=subprocess.STDOUT))
    try:
        deadline, states = time.monotonic() + 40, ""
        while time.monotonic() < deadline:
            if any(p.poll() is not None for p in procs):
                break
            states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], env=env, capture_output=True,
                                    text=True).stdout
            if states.count("idle") == len(names):
                break
            time.sleep(0.5)  # a poll: slurm tells a node's state only when asked
        if states.count("idle") != len(names):
            died = [f"{p.args[0]} exited {p.returncode}" for p in procs if p.poll() is not None]
            errors = []
            for name, path in logs.items():
                errors += [f"{name}: {line}" for line in path.read_text(errors="replace").splitlines()
                           if "error" in line.lower() or "fatal" in line.lower()][-3:]
            pytest.skip(f"the SLURM daemons did not bring up {len(names)} idle node(s) within 40 s here ({how}); sinfo: "
                        f"{states.strip()!r}; {'; '.join(died)}; " + " | ".join(errors))
        yield env, names, root, how
    finally:
        subprocess.run(["scancel", "--quiet", "-u", "root"], env=env, capture_output=True)
        _stop(procs)


def sbatch(env: dict, root: Path, name: str, header: str, command: str, timeout: float = 150) -> tuple[int, str]:
    """Submit a batch script and wait for it to end (polling scontrol: sbatch --wait polls only every few
    seconds): (its exit code, its output)."""
    script = root / f"{name}.sh"
    log = root / f"{name}.log"
    script.write_text(f"#!/bin/bash\n{header}\n#SBATCH --output={log}\n{command}\n")
    submitted = subprocess.run(["sbatch", "--parsable", "--chdir", str(root), str(script)], env=env,
                               capture_output=True, text=True, timeout=30)
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        shown = subprocess.run(["scontrol", "show", "job", "-o", job], env=env, capture_output=True, text=True).stdout
        fields = dict(f.split("=", 1) for f in shown.split() if "=" in f)
        if fields.get("JobState") in ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"):
            code = int(fields.get("ExitCode", "1:0").split(":")[0])
            return code, (log.read_text() if log.exists() else "") + f"\n[job {job}: {fields['JobState']}]"
        time.sleep(0.2)  # a poll: slurm tells a job's state only when asked
    subprocess.run(["scancel", job], env=env, capture_output=True)
    raise AssertionError(f"job {name} ({job}) did not end within {timeout} s: {log.read_text() if log.exists() else ''}")


def test_srun_acc_launch_one_launcher_per_node(slurm):
    """#SBATCH --nodes=2 --ntasks-per-node=1; srun acc launch --backend ddp: 2 machines x 1 process, nothing typed."""
    env, names, root, how = slurm
    if len(names) < 2:
        pytest.skip(f"only one name resolves to this machine ({names[0]}), so the test cluster has one node; a second "
                    "slurmd needs a second name")
    out = root / "per-node"
    started = time.monotonic()
    code, log = sbatch(env, root, "per-node", "#SBATCH --nodes=2 --ntasks-per-node=1",
                       f"srun {ACC} launch --backend ddp --output-dir '' --rdzv-timeout 60 "
                       f"{WORKERS / 'machines.py'} --out {out}")
    took = time.monotonic() - started
    assert code == 0, log
    results = read_rank_results(out)
    assert sorted(results) == [0, 1] and {r["sum"] for r in results.values()} == {2.0}, (results, log)
    assert [results[r]["machine_rank"] for r in (0, 1)] == [0, 1] and results[0]["main"]
    assert "slurmstepd" not in {r["parent"] for r in results.values()}  # each launcher started its worker
    assert "before the rendezvous (machine 1 of 2): main address " \
           f"{names[0]} (from slurm first host of SLURM_STEP_NODELIST=" in log, log
    assert "2 machine(s), as slurm allocated (SLURM_STEP_NUM_NODES=2)" in log
    assert "acc launch: machine 1 of 2 (" in log and "the main process (rank 0) runs on machine 0" in log
    assert leftover_processes(str(out)) == [], log
    print(f"{how}; job with 2 launchers took {took:.1f} s")


def test_srun_acc_launch_one_task_per_process(slurm):
    """#SBATCH --nodes=1 --ntasks-per-node=2; srun acc launch: each task is one of the 2 ddp processes."""
    env, names, root, how = slurm
    out = root / "per-task"
    started = time.monotonic()
    code, log = sbatch(env, root, "per-task", "#SBATCH --nodes=1 --ntasks-per-node=2",
                       f"srun --kill-on-bad-exit=1 {ACC} launch --backend ddp --output-dir '' "
                       f"{WORKERS / 'machines.py'} --out {out}")
    took = time.monotonic() - started
    assert code == 0, log
    results = read_rank_results(out)
    assert sorted(results) == [0, 1] and {r["sum"] for r in results.values()} == {2.0}, (results, log)
    assert {results[r]["local_rank"] for r in (0, 1)} == {0, 1} and results[0]["main"]
    # no agent in between: each worker is the process srun started (its parent is slurmstepd, not a launcher)
    assert [results[r]["parent"] for r in (0, 1)] == ["slurmstepd", "slurmstepd"], results
    assert "before the rendezvous (rank 1 of 2, on machine 0): main address 127.0.0.1 (from slurm one node: the " \
           "loopback)" in log, log
    assert leftover_processes(str(out)) == [], log
    print(f"{how}; job with 2 tasks took {took:.1f} s")


def test_acc_launch_in_the_batch_script_of_two_nodes_is_refused(slurm):
    """Without srun, acc launch would run on the first node only: one clear line, exit 2, nothing started."""
    env, names, root, how = slurm
    if len(names) < 2:
        pytest.skip(f"only one name resolves to this machine ({names[0]}): the test cluster has one node")
    code, log = sbatch(env, root, "no-srun", "#SBATCH --nodes=2 --ntasks-per-node=1",
                       f"{ACC} launch --backend ddp --output-dir '' {WORKERS / 'machines.py'} --out {root / 'none'}")
    assert code == 2, log
    assert "acc launch runs outside srun (no SLURM_STEP_ID) in SLURM job " in log and " of 2 nodes " \
           "(SLURM_JOB_NUM_NODES=2)" in log and "srun --ntasks-per-node=1 acc launch" in log, log
    assert "Traceback" not in log and not (root / "none").exists()
