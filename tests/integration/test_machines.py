"""Two machines as two launchers on this machine (and, where the sandbox allows, in two network namespaces joined
by a veth pair): which machine holds the main process, a machine that never arrives, a machine lost mid-run."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from tests.conftest import ACC, WORKERS, clean_env, read_rank_results
from tests.integration.chaos import leftover_processes
from tests.waiting import is_json, read_until, wait_for_exit, wait_for_text

pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def launcher(tmp_path: Path, rank: int, port: int, out: Path, *extra: str, ip: str = "127.0.0.1", prefix=(),
             env: dict | None = None, mode: str = "run") -> subprocess.Popen:
    cmd = [*prefix, ACC, "launch", "--backend", "ddp", "--nproc", "2", "--num-machines", "2", "--machine-rank",
           str(rank), "--main-process-ip", ip, "--main-process-port", str(port), *extra,
           str(WORKERS / "machines.py"), "--out", str(out), "--mode", mode]
    return subprocess.Popen(cmd, cwd=tmp_path, env=env or clean_env(tmp_path), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def wait_for_line(proc: subprocess.Popen, text: str, timeout: float = 60) -> str:
    """What `proc` printed on stderr up to `text` (and any more it read; communicate() gives the rest)."""
    seen = read_until(proc.stderr, text, timeout)
    if text not in seen:
        raise AssertionError(f"{text!r} not printed: {seen}")
    return seen


ARRIVED = "acc launch: before the rendezvous (machine 1 of 2)"  # machine 1 is past its checks, at the rendezvous


@pytest.mark.parametrize("rdzv", ["default", "c10d"])
def test_machine_0_hosts_the_main_process_whatever_the_arrival_order(tmp_path, rdzv):
    """Machine 1 arrives first. Default (static, as Accelerate): machine k hosts global ranks 2k, 2k+1. With c10d
    the order is c10d's (host name, then launcher pid: machine 1 here), and each launcher says so at start."""
    port, out = free_port(), tmp_path / "o"
    extra = [] if rdzv == "default" else ["--rdzv-backend", "c10d"]
    first = launcher(tmp_path, 1, port, out, *extra)
    arrived = wait_for_line(first, ARRIVED)
    second = launcher(tmp_path, 0, port, out, *extra)
    errs = {}
    for rank, proc in ((1, first), (0, second)):
        _, errs[rank] = proc.communicate(timeout=120)
        assert proc.returncode == 0, errs[rank]
    errs[1] = arrived + errs[1]
    results = read_rank_results(out)
    assert sorted(results) == [0, 1, 2, 3] and {r["sum"] for r in results.values()} == {4.0}
    main = 0 if rdzv == "default" else 1  # with c10d machine 1 (started first: the lower pid) got group rank 0
    for rank, r in results.items():
        expected_machine = rank // 2 if main == 0 else 1 - rank // 2
        assert r["machine_rank"] == expected_machine, results
    assert results[0]["main"] and results[0]["machine_rank"] == main
    for machine in (0, 1):
        said = errs[machine]
        assert f"acc launch: machine {machine} of 2 (" in said
        assert f"the main process (rank 0) runs on machine {main} (" in said
        position = machine if main == 0 else 1 - machine
        assert f"global ranks {2 * position}..{2 * position + 1}" in said
    if rdzv == "c10d":
        assert "the c10d rendezvous orders machines by host name, then launcher pid (--rdzv-backend static keeps " \
               "it on machine 0)" in errs[0]
    else:
        assert "the static rendezvous gives machine k the global ranks k*nproc.." in errs[0]


def test_a_machine_that_never_arrives_fails_the_launch_naming_it(tmp_path):
    port, out = free_port(), tmp_path / "o"
    started = time.monotonic()
    proc = launcher(tmp_path, 0, port, out, "--rdzv-timeout", "3")
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - started
    assert proc.returncode == 1 and took < 15, (took, err)
    assert (f"acc launch: machine(s) 1 of 2 did not join the rendezvous at 127.0.0.1:{port} within 3 s "
            f"(--rdzv-timeout); joined: machine 0 (") in err
    assert "Start `acc launch ... --machine-rank 1` on the missing machine(s) with the same " \
           "--main-process-ip/--main-process-port, or give them longer: add --rdzv-timeout 1800 to the acc launch " \
           "command of every machine" in err
    assert "Traceback" not in err and not out.exists()  # no worker started
    # and seen from another machine: machine 0 never answers
    proc = launcher(tmp_path, 1, free_port(), out, "--rdzv-timeout", "2")
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1
    assert "machine 0 (the main machine, expected at 127.0.0.1:" in err and "did not answer within 2 s" in err
    assert "this is machine 1 of 2" in err and "add --rdzv-timeout 1800" in err and "Traceback" not in err
    assert leftover_processes(str(out)) == []


def test_the_default_rdzv_timeout_is_shown(tmp_path):
    proc = subprocess.run([ACC, "launch", "--backend", "ddp", "--help"], capture_output=True, text=True,
                          env=clean_env(tmp_path))
    text = " ".join(proc.stdout.split())
    assert "--rdzv-timeout NUM seconds the launchers of a multi-machine run wait for every machine to join" in text
    assert "default: 900.0; env ACC_RDZV_TIMEOUT" in text


@pytest.mark.parametrize("victim,mode", [(1, "sleep"), (0, "loop"), (1, "early")])
def test_a_machine_lost_mid_run_stops_the_other_within_15_s(tmp_path, victim, mode):
    """The launcher of one machine is SIGKILLed (its workers die with it). The other machine stops its workers,
    says which machine was lost and exits 1 within 15 s, whether its workers were idle (sleep: only the
    heartbeats tell), in collectives (loop: they fail at once), or not started yet (early: killed right after the
    roll call, machine 0's agent waits inside torch's store for it, and the launcher stops itself). No process of
    either machine is left."""
    port, out = free_port(), tmp_path / "o"
    procs = {k: launcher(tmp_path, k, port, out, mode="sleep" if mode == "early" else mode) for k in (0, 1)}
    try:
        wait_for_line(procs[victim], "acc launch: machine")
        if mode != "early":
            assert wait_for_text([out / f"rank{r}.json" for r in range(4)], timeout=60, ended=procs.values(),
                                 complete=is_json)
        workers = [r["pid"] for r in read_rank_results(out).values()] if out.exists() else []
        if mode != "early":
            time.sleep(0.5)  # on purpose: the loss comes mid-run, the workers idle (sleep) or in collectives (loop)
        killed = time.monotonic()
        procs[victim].kill()
        _, err = procs[1 - victim].communicate(timeout=60)
        took = time.monotonic() - killed
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()
    assert procs[1 - victim].returncode == 1 and took < 15, (took, err)
    host = socket.gethostname()
    if victim == 1:
        assert f"acc launch: machine 1 ({host}, launcher pid {procs[1].pid}) was lost: its launcher sent no heartbeat " \
               "for " in err
    else:
        assert f"acc launch: machine 0 ({host}, launcher pid {procs[0].pid}) was lost: its rendezvous store at " \
               f"127.0.0.1:{port} stopped answering" in err
    assert ("the workers on this machine were stopped" in err) if mode != "loop" else \
        ("the workers here failed because of it:" in err and "acc launch: the run failed" in err)
    wait_for_exit([*workers, *leftover_processes(str(out))], timeout=10)  # what was still ending
    alive = [p for p in workers if Path(f"/proc/{p}").exists()
             and "zombie" not in Path(f"/proc/{p}/status").read_text().lower()]
    assert alive == [] and leftover_processes(str(out)) == []


def test_a_failing_worker_on_one_machine_is_not_taken_for_a_lost_machine(tmp_path):
    port, out = free_port(), tmp_path / "o"
    procs = {k: launcher(tmp_path, k, port, out, mode="raise") for k in (0, 1)}
    errs = {k: p.communicate(timeout=120)[1] for k, p in procs.items()}
    assert procs[1].returncode == 1 and procs[0].returncode != 0, errs
    assert "ValueError: boom on machine 1" in errs[1] and "rank 2 (local rank 0), first failure" in errs[1]
    assert "was lost" not in errs[0] + errs[1], errs
    assert leftover_processes(str(out)) == []


# ------------------------------------------------------------------ two hosts: network namespaces and a veth pair (the two_hosts fixture: conftest.py)


def test_two_hosts_in_network_namespaces_keep_the_main_process_on_machine_0(tmp_path, two_hosts):
    port, out = free_port(), tmp_path / "o"
    ip = two_hosts[0][1]

    def start(rank):
        prefix, _, link = two_hosts[rank]
        env = clean_env(tmp_path, GLOO_SOCKET_IFNAME=link)  # the workers' gloo traffic goes over the veth pair
        return launcher(tmp_path, rank, port, out, ip=ip, prefix=prefix, env=env)

    first = start(1)
    wait_for_line(first, ARRIVED)
    second = start(0)
    for proc in (first, second):
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    results = read_rank_results(out)
    assert [results[r]["machine_rank"] for r in range(4)] == [0, 0, 1, 1] and results[0]["main"]
    assert {r["sum"] for r in results.values()} == {4.0}
    assert json.loads((out / "rank0.json").read_text())["launcher"] != json.loads((out / "rank2.json").read_text())[
        "launcher"]
    assert os.path.exists(out)
