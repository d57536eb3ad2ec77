"""Let no one in, on real processes: what a run listens on (from /proc, as `ss -ltnp` shows it), a bad listen
address, credentials that never reach a file, and failure reports that read from the user's line to the error.

The one-machine runs happen in a network namespace where this machine's host name resolves to a non-loopback
address (10.78.n.1), as it does on a cluster machine: there torch, left to itself, listens with its store on every
interface and with gloo on that address (the control test shows both), so the assertions below can fail."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.conftest import ACC, ROOT, WORKERS, clean_env, read_rank_results
from tests.integration.chaos import leftover_processes
from tests.integration.sockets import listening_sockets
from tests.waiting import wait_for_paths

pytestmark = pytest.mark.slow


CONTROL = """
import json, os, sys
sys.path.insert(0, {root!r})
import torch.distributed as dist
from tests.integration.sockets import listening_sockets
store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
dist.init_process_group("gloo", store=store, rank=0, world_size=1)
print(json.dumps([s.address for s in listening_sockets(os.getpid())]))
"""


def test_control_torch_alone_listens_on_every_interface_and_on_the_host_names_address(tmp_path, public_host):
    prefix, address = public_host
    proc = subprocess.run([*prefix, sys.executable, "-c", CONTROL.format(root=str(ROOT))], capture_output=True,
                          text=True, timeout=120, env=clean_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "::" in found or "0.0.0.0" in found  # the store: every interface
    assert address in found  # gloo: the host name's address


def _wait_for(paths: list[Path], proc: subprocess.Popen, timeout: float = 240) -> None:
    if wait_for_paths(paths, timeout, ended=[proc]):
        return
    if proc.poll() is not None:
        raise AssertionError(f"the run ended early ({proc.returncode}): {proc.stderr.read()}")
    proc.kill()
    raise AssertionError(f"the ranks never got ready: {proc.stderr.read()}")


@pytest.mark.parametrize("backend", ["ddp", "fsdp", "deepspeed"])
def test_a_one_machine_run_listens_on_loopback_only(tmp_path, public_host, backend):
    prefix, address = public_host
    out = tmp_path / "o"
    out.mkdir()
    proc = subprocess.Popen([*prefix, ACC, "launch", "--backend", backend, "--nproc", "2", "--output-dir", "",
                             str(WORKERS / "listening.py"), "--out", str(out)], cwd=tmp_path, env=clean_env(tmp_path),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for([out / "rank0.json", out / "rank1.json"], proc)
        sockets = listening_sockets(proc.pid)  # `ip netns exec` became the launcher: proc.pid is acc launch
    finally:
        (out / "go").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert [s for s in sockets if not s.loopback] == [], f"listening beyond loopback: {sockets}"
    ranks = {r["pid"] for r in read_rank_results(out).values()}
    store = re.search(r"acc launch: listening: loopback only: the rendezvous store on 127\.0\.0\.1:(\d+)", err)
    assert store, err
    assert {s.port for s in sockets if s.pid == proc.pid} == {int(store.group(1))}  # the launcher: its store only
    # every rank has its own process-group listener (gloo), besides the store's socket a forked rank inherits
    assert all(any(s.pid == pid and s.port != int(store.group(1)) for s in sockets) for pid in ranks), sockets


PYTHON_LAUNCH = """
import json, os, sys
sys.path.insert(0, {root!r})
import torch
import acc
from tests.integration.sockets import listening_sockets

def train(root):
    accelerator = acc.Accelerator()
    accelerator.reduce(torch.ones(1), "sum")  # the process group connected
    found = [[s.pid, s.address] for s in listening_sockets(root)]
    accelerator.wait_for_everyone()  # every rank still there while rank 0 looked
    accelerator.end_training()
    return found

print("SOCKETS", json.dumps(acc.launch(train, os.getpid(), backend="ddp", nproc=2, output_dir="")))
"""


def test_acc_launch_from_python_listens_on_loopback_only(tmp_path, public_host):
    prefix, _ = public_host
    proc = subprocess.run([*prefix, sys.executable, "-c", PYTHON_LAUNCH.format(root=str(ROOT))], cwd=tmp_path,
                          capture_output=True, text=True, timeout=180, env=clean_env(tmp_path))
    assert proc.returncode == 0, proc.stderr
    found = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("SOCKETS "))[len("SOCKETS "):])
    assert len({pid for pid, _ in found}) == 3, found  # the calling process (the store) and both ranks
    assert {address for _, address in found} == {"127.0.0.1"}, found


def test_asking_for_every_interface_is_honoured(tmp_path, public_host):
    prefix, _ = public_host
    out = tmp_path / "o"
    out.mkdir()
    proc = subprocess.Popen([*prefix, ACC, "launch", "--backend", "ddp", "--nproc", "2", "--output-dir", "",
                             "--listen-address", "0.0.0.0", str(WORKERS / "listening.py"), "--out", str(out)],
                            cwd=tmp_path, env=clean_env(tmp_path), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        _wait_for([out / "rank0.json", out / "rank1.json"], proc)
        sockets = listening_sockets(proc.pid)
    finally:
        (out / "go").touch()
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "acc launch: listening: every interface: the rendezvous store on 0.0.0.0:" in err
    assert [s.address for s in sockets if s.pid == proc.pid] == ["0.0.0.0"]


def test_a_listen_address_that_is_not_this_machines_is_a_clear_error(tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print('never runs')\n")
    token = f"acc-bad-listen-{uuid.uuid4().hex[:8]}"
    start = time.monotonic()
    proc = subprocess.run([ACC, "launch", "--backend", "ddp", "--nproc", "2", "--output-dir", "", "--listen-address",
                           "192.0.2.254", str(script), token], cwd=tmp_path, env=clean_env(tmp_path),
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and time.monotonic() - start < 60
    assert "the rendezvous store cannot listen on 192.0.2.254" in proc.stderr
    assert "it is not an address of this machine (its addresses: 127.0.0.1" in proc.stderr
    assert "give --listen-address ADDRESS" in proc.stderr and "Traceback" not in proc.stderr
    assert "never runs" not in proc.stdout and leftover_processes(token) == []


# ------------------------------------------------------------------ two machines in two namespaces (the two_hosts fixture: conftest.py)


def test_two_machines_listen_only_on_the_interface_that_reaches_the_main_machine(tmp_path, two_hosts):
    """No GLOO_SOCKET_IFNAME given (the host name resolves to 127.0.0.1 in both namespaces, so gloo left to itself
    would listen on loopback and the machines could not connect): acc picks the veth interface on each machine, and
    machine 0's store listens on its veth address only."""
    import socket

    with socket.socket() as s:
        s.bind(("", 0))
        port = s.getsockname()[1]
    out = tmp_path / "o"
    out.mkdir()
    procs = []
    for rank in (1, 0):
        prefix, _, _ = two_hosts[rank]
        procs.append(subprocess.Popen(
            [*prefix, ACC, "launch", "--backend", "ddp", "--nproc", "2", "--num-machines", "2", "--machine-rank",
             str(rank), "--main-process-ip", two_hosts[0][1], "--main-process-port", str(port), "--output-dir", "",
             str(WORKERS / "listening.py"), "--out", str(out)], cwd=tmp_path, env=clean_env(tmp_path),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    machine1, machine0 = procs
    try:
        for proc in procs:
            _wait_for([out / f"rank{r}.json" for r in range(4)], proc)
        sockets = {0: listening_sockets(machine0.pid), 1: listening_sockets(machine1.pid)}
    finally:
        (out / "go").touch()
    errs = {}
    for rank, proc in ((0, machine0), (1, machine1)):
        _, errs[rank] = proc.communicate(timeout=120)
        assert proc.returncode == 0, errs[rank]
    results = read_rank_results(out)
    assert {r["sum"] for r in results.values()} == {4.0} and {r["gloo"] for r in results.values()} == \
        {two_hosts[0][2], two_hosts[1][2]}
    for rank in (0, 1):
        assert not [s for s in sockets[rank] if s.every_interface], sockets[rank]
        assert {s.address for s in sockets[rank]} == {two_hosts[rank][1]}, sockets[rank]
    store = [s for s in sockets[0] if s.pid == machine0.pid]
    assert [(s.address, s.port) for s in store] == [(two_hosts[0][1], port)]
    assert not [s for s in sockets[1] if s.pid == machine1.pid]  # machine 1's launcher listens on nothing
    assert f"the rendezvous store on {two_hosts[0][1]}:{port} only" in errs[0]
    assert "no store here (machine 0 hosts it at" in errs[1]


# ------------------------------------------------------------------ credentials


def test_credentials_given_three_ways_never_reach_a_file(tmp_path):
    """A script argument (space and `=` forms, and a token-shaped positional), environment variables and tracker
    hyper-parameters: the run (2 ddp processes) records its manifest, per-process logs, a checkpoint and a jsonl
    tracker log, and none of the values is in any file under its directory. The ranks did receive them (they record
    their digests)."""
    tokens = {"arg": f"s3cr3t-arg-{uuid.uuid4().hex}", "eq": f"s3cr3t-eq-{uuid.uuid4().hex}",
              "shaped": "hf_" + uuid.uuid4().hex[:30], "env": f"s3cr3t-env-{uuid.uuid4().hex}",
              "wandb": f"s3cr3t-wandb-{uuid.uuid4().hex}"}
    env = clean_env(tmp_path, HF_TOKEN=tokens["env"], WANDB_API_KEY=tokens["wandb"])
    out = tmp_path / "o"
    proc = subprocess.run([ACC, "launch", "--backend", "ddp", "--nproc", "2", "--output-dir", str(tmp_path / "runs"),
                           "--tee", str(WORKERS / "given_credentials.py"), "--out", str(out), "--hf_token",
                           tokens["arg"], f"--wandb-api-key={tokens['eq']}", tokens["shaped"]],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    expected = [hashlib.sha256(tokens[k].encode()).hexdigest() for k in ("arg", "eq", "shaped", "env", "wandb")]
    assert {tuple(r["digests"]) for r in read_rank_results(out).values()} == {tuple(expected)}
    files = [p for p in tmp_path.rglob("*") if p.is_file() and "user-config" not in p.parts]
    kinds = {p.name for p in files}
    assert "manifest.json" in kinds and any(p.suffix == ".jsonl" for p in files) and \
        any(p.name == "stdout.log" for p in files), sorted(kinds)  # the run recorded what it records
    checkpoint = next(p for p in files if p.name == "manifest.json" and "checkpoint_" in str(p))
    assert "<redacted>" in checkpoint.read_text()  # the command line is there, redacted
    for path in files:
        data = path.read_bytes()
        leaked = [k for k, v in tokens.items() if v.encode() in data]
        assert not leaked, f"{path} holds the {', '.join(leaked)} credential"
    assert not any(v in proc.stdout + proc.stderr for v in tokens.values())  # nor the console


# ------------------------------------------------------------------ failure reports


def _frames(report: str) -> list[str]:
    block = report[report.index("first failure"):]
    return [ln.strip() for ln in block.splitlines() if ln.strip().startswith("File ")]


@pytest.mark.parametrize("start", ["fork", "spawn"])
def test_a_failure_report_starts_at_the_users_line_without_pluggy_or_acc_frames(tmp_path, start):
    import pluggy

    import acc

    acc_dir, pluggy_dir = str(Path(acc.__file__).parent), str(Path(pluggy.__file__).parent)
    cmd = [ACC, "launch", "--backend", "ddp", "--nproc", "2", "-p", "timing", "--start-method", start,
           "--output-dir", "", str(WORKERS / "fails_in_backward.py")]
    proc = subprocess.run(cmd, cwd=tmp_path, env=clean_env(tmp_path), capture_output=True, text=True, timeout=180)
    assert proc.returncode == 1, proc.stderr
    report = proc.stderr[proc.stderr.index("acc launch: the run failed"):]
    frames = _frames(report)
    assert "fails_in_backward.py" in frames[0] and "in <module>" in frames[0], report  # the user's frames first
    assert "fails_in_backward.py" in frames[1] and "in train" in frames[1], report
    assert not [f for f in frames if acc_dir in f or pluggy_dir in f], report
    assert "torch" in frames[2]  # then torch's own frames, down to the error
    assert "RuntimeError: element 0 of tensors does not require grad" in report
    assert "hidden; ACC_DEBUG=1 shows every frame" in report
    if start == "spawn":
        return  # ACC_DEBUG=1 is the same in both: shown once
    debug = subprocess.run(cmd, cwd=tmp_path, env=clean_env(tmp_path, ACC_DEBUG="1"), capture_output=True,
                           text=True, timeout=180)
    frames = _frames(debug.stderr[debug.stderr.index("acc launch: the run failed"):])
    assert any(pluggy_dir in f for f in frames) and any(acc_dir in f for f in frames)  # ACC_DEBUG=1: everything


def test_deepspeed_merge_weights_reads_only_the_checkpoints_listed_files(tmp_path):
    """DeepSpeed's zero_to_fp32 finds its files by globbing: a file planted beside them (not in the manifest) is
    refused, as is a listed file that links out of the checkpoint; the untouched checkpoint merges."""
    import shutil

    from tests.conftest import run

    proc = run([ACC, "launch", "--backend", "deepspeed", "--nproc", "2", "--zero-stage", "2", "--output-dir", "",
                str(WORKERS / "layers.py"), "--out", str(tmp_path / "o"), "--steps", "2", "--save",
                str(tmp_path / "ckpt")], tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stderr
    states = tmp_path / "ckpt" / "deepspeed" / "state"
    optim = sorted(states.glob("*optim_states.pt"))
    assert len(optim) == 2, sorted(p.name for p in states.iterdir())
    merge = [ACC, "merge-weights", str(tmp_path / "ckpt"), str(tmp_path / "merged.safetensors")]
    planted = states / optim[-1].name.replace("rank_1", "rank_1x")
    shutil.copyfile(optim[-1], planted)  # same bytes as a verified file, but not listed
    result = run(merge, tmp_path, timeout=300)
    assert result.returncode != 0 and not (tmp_path / "merged.safetensors").exists()
    assert f"{planted}: DeepSpeed asked for a file the manifest of" in result.stderr, result.stderr
    planted.unlink()
    outside = tmp_path / "outside.pt"
    shutil.copyfile(optim[0], outside)
    optim[0].unlink()
    optim[0].symlink_to(outside)
    result = run(merge, tmp_path, timeout=300)
    assert result.returncode != 0 and f"refused to read the entry 'deepspeed/state/{optim[0].name}'" in result.stderr
    optim[0].unlink()
    shutil.copyfile(outside, optim[0])
    result = run(merge, tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
