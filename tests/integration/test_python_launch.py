"""`acc.launch(fn)`, `notebook_launcher` and `debug_launcher` from pytest (workers forked from this process) and from
a plain script: return values, the failure report, interrupts, settings and their sources, restarts, the CUDA
refusal, fsdp, and the parity check. Real gloo processes; every test checks that no worker is left."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

import acc
from acc.launcher import processes
from tests.conftest import ROOT, WORKERS, clean_env
from tests.waiting import is_pid, wait_for_exit, wait_for_text
from tests.workers import launch_fn

pytestmark = pytest.mark.slow


def children(pid: int) -> list[tuple[int, str]]:
    """(pid, state) of every process whose parent is `pid` (zombies included; one gone meanwhile is left out)."""
    return [(child, got) for child in processes.children(pid) if (got := processes.state(child)) is not None]


def alive(pid: int) -> bool:
    return processes.state(pid) not in (None, "Z")


def started_since(before: set[int]) -> list[tuple[int, str]]:
    """This process's children (pid, state) that were not among the pids `before`: what a test started."""
    return [(pid, state) for pid, state in children(os.getpid()) if pid not in before]


@pytest.fixture(autouse=True)
def nothing_left_behind():
    """No process (worker or zombie) of this test's launches outlives the test. Yields the pids of the children
    that were there before it (another test's, which are not this test's to judge)."""
    before = {pid for pid, _ in children(os.getpid())}
    yield before
    deadline = time.monotonic() + 10
    while started_since(before) and time.monotonic() < deadline:
        time.sleep(0.05)  # a poll: a child being reaped (by the code that started it) has no event to wait on
    assert started_since(before) == [], "a launched process was left behind"


def test_returns_the_main_process_value_or_every_rank_and_a_second_launch_works():
    scale = 3.0

    def closure(tag):  # a closure: forked, never pickled
        from acc import Accelerator

        accelerator = Accelerator()
        return {"tag": tag, "rank": accelerator.process_index, "world": accelerator.num_processes,
                "scaled": scale * (accelerator.process_index + 1), "ppid": os.getppid()}

    main = acc.launch(closure, "one", backend="ddp", nproc=2, output_dir="")
    assert main == {"tag": "one", "rank": 0, "world": 2, "scaled": 3.0, "ppid": os.getpid()}
    every = acc.launch(closure, "two", backend="ddp", nproc=2, return_all=True, output_dir="")
    assert [r["rank"] for r in every] == [0, 1] and [r["scaled"] for r in every] == [3.0, 6.0]
    assert {r["ppid"] for r in every} == {os.getpid()}  # forked from this process
    assert acc.launch(lambda: 41 + 1, backend="ddp", nproc=2, output_dir="") == 42


def test_the_environment_and_signal_handlers_of_the_caller_are_restored():
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGCHLD, signal.SIGUSR1)}
    env = dict(os.environ)
    seen = acc.launch(lambda: (os.environ.get("ACC_LAUNCH") is not None, os.environ["WORLD_SIZE"]), backend="ddp",
                      nproc=2, output_dir="")
    assert seen == (True, "2")  # the workers got the launch's environment
    assert dict(os.environ) == env
    assert {s: signal.getsignal(s) for s in handlers} == handlers


def test_a_failing_rank_raises_the_report_with_its_own_traceback():
    with pytest.raises(acc.WorkerFailedError) as info:
        acc.launch(launch_fn.fail_on_rank_one, backend="ddp", nproc=2, output_dir="")
    exc = info.value
    assert (exc.rank, exc.local_rank, exc.exitcode) == (1, 1, 1)
    assert exc.error == "ValueError: bad batch on rank 1"
    assert 'raise ValueError("bad batch on rank 1")' in exc.traceback and "launch_fn.py" in exc.traceback
    assert "acc.launch: the run failed" in str(exc) and "rank 1 (local rank 1), first failure: exit code 1" in str(exc)
    assert 'raise ValueError("bad batch on rank 1")' in str(exc)
    assert exc.failures[1] == 1
    assert isinstance(exc, acc.AccError) and isinstance(exc, RuntimeError)


def test_a_rank_killed_by_a_signal_is_named():
    def killed():
        from acc import Accelerator

        accelerator = Accelerator()
        if accelerator.process_index == 1:
            print("rank 1 was here", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        accelerator.wait_for_everyone()

    with pytest.raises(acc.WorkerFailedError) as info:
        acc.launch(killed, backend="ddp", nproc=2, output_dir="")
    assert info.value.rank == 1 and info.value.exitcode == -signal.SIGKILL
    assert "first failure: killed by signal SIGKILL" in str(info.value)
    assert "rank 1 was here" in str(info.value)  # the tail of its own output (its log file)


def test_settings_resolve_argument_env_project_file_user_file_default_with_sources(tmp_path, monkeypatch,
                                                                                 nothing_left_behind):
    (tmp_path / "acc.toml").write_text('mixed_precision = "bf16"\ngradient_accumulation_steps = 2\ntimeout = 50\n')
    user = tmp_path / "user-config"
    user.mkdir()
    (user / "config.toml").write_text("monitor_interval = 0.2\ntimeout = 40\n")
    monkeypatch.setenv("ACC_TIMEOUT", "77")
    main = acc.launch(launch_fn.describe_rank, "s", backend="ddp", nproc=2, gradient_accumulation_steps=3,
                      output_dir="")
    s = main["settings"]
    assert s["gradient_accumulation_steps"] == [3, "argument acc.launch(gradient_accumulation_steps=...)"]
    assert s["timeout"] == [77.0, "env ACC_TIMEOUT"]
    assert s["mixed_precision"] == ["bf16", f"project file {tmp_path / 'acc.toml'}"]
    assert s["monitor_interval"] == [0.2, f"user file {user / 'config.toml'}"]
    assert s["cpu"] == [False, "default"]
    assert s["backend"] == ["ddp", "argument acc.launch(backend=...)"]
    text = acc.launch(launch_fn.describe_rank, "s", backend="ddp", nproc=2, gradient_accumulation_steps=3,
                      dry_run=True)
    assert "argument acc.launch(gradient_accumulation_steps=...)" in text and "env ACC_TIMEOUT" in text
    assert "function tests.workers.launch_fn.describe_rank(*args)" in text
    assert started_since(nothing_left_behind) == []  # a dry run starts nothing


def test_detection_picks_ddp_for_several_processes_and_a_config_file_can_choose_the_backend(tmp_path):
    assert acc.launch(launch_fn.describe_rank, "d", nproc=2, output_dir="")["settings"]["backend"] == \
        ["ddp", "detected"]
    other = tmp_path / "elsewhere.toml"
    other.write_text('backend = "ddp"\nnproc = 2\n')
    main = acc.launch(launch_fn.describe_rank, "f", config_file=str(other), output_dir="")
    assert main["world"] == 2 and main["settings"]["nproc"] == [2, f"config file {other}"]


def test_every_launch_records_its_run_manifest_even_two_in_the_same_second(tmp_path, monkeypatch):
    import acc.assembly.manifest

    real = acc.assembly.manifest.time.strftime
    monkeypatch.setattr(acc.assembly.manifest.time, "strftime", lambda fmt, *t: "20260101-000000" if fmt == "%Y%m%d-%H%M%S"
                        else real(fmt, *t))
    for tag in ("first", "second"):
        assert acc.launch(launch_fn.describe_rank, tag, backend="ddp", nproc=2)["tag"] == tag
    runs = sorted((tmp_path / "acc_runs").iterdir())
    assert [r.name for r in runs] == [f"20260101-000000-ddp-m0-{os.getpid()}",
                                      f"20260101-000000-ddp-m0-{os.getpid()}-2"]
    for run in runs:
        manifest = json.loads((run / "manifest.json").read_text())
        assert manifest["target"] == "tests.workers.launch_fn.describe_rank"
        assert manifest["settings"]["sources"]["nproc"] == "argument acc.launch(nproc=...)"
        assert list((run / "logs").glob("*/attempt_0/1/stdout.log"))  # rank 1's output is kept with the run


def test_bad_arguments_are_refused_before_anything_starts():
    with pytest.raises(acc.ConfigError, match=r"mixed_precison.*did you mean 'mixed_precision'"):
        acc.launch(print, nproc=2, mixed_precison="bf16")
    with pytest.raises(acc.ConfigError, match=r"acc.launch\(nproc=...\): expected an integer >= 1, got 0"):
        acc.launch(print, nproc=0)
    with pytest.raises(acc.ConfigError, match=r"acc.launch\(mixed_precision=...\).*one of: no, fp16, bf16"):
        acc.launch(print, backend="ddp", nproc=2, mixed_precision="fp8")
    with pytest.raises(TypeError, match="expected a function"):
        acc.launch("train.py", nproc=2)


def test_the_cpu_backend_runs_the_function_here_with_the_launch_settings():
    def here():
        from acc import Accelerator

        accelerator = Accelerator()
        return os.getpid(), accelerator.num_processes, accelerator.settings.source("mixed_precision")

    env = dict(os.environ)
    assert acc.launch(here, backend="cpu", mixed_precision="bf16", output_dir="") == \
        (os.getpid(), 1, "argument acc.launch(mixed_precision=...)")
    assert dict(os.environ) == env
    with pytest.raises(acc.WorkerFailedError) as info:
        acc.launch(lambda: 1 / 0, output_dir="")
    assert info.value.rank == 0 and info.value.error == "ZeroDivisionError: division by zero"
    assert isinstance(info.value.__cause__, ZeroDivisionError)


def test_two_processes_of_batch_b_train_as_one_process_of_batch_2b():
    """Parity through acc.launch (semantics="acc": seeded shuffling, one scheduler step per optimizer step): the same
    samples at every step, the same LR, the same weights to 1e-6. With Accelerate's semantics (the default) the
    scheduler steps num_processes times per optimizer step, so the same check fails: it can tell."""
    two = acc.launch(launch_fn.train_regression, 4, backend="ddp", nproc=2, semantics="acc", output_dir="")
    one = acc.launch(launch_fn.train_regression, 8, backend="cpu", semantics="acc", output_dir="")
    assert (two["world"], one["world"]) == (2, 1)
    assert two["seen"] == one["seen"] and len(one["seen"]) == 16
    assert two["lrs"] == one["lrs"]
    for name, weight in one["weights"].items():
        assert (two["weights"][name] - weight).abs().max().item() <= 1e-6, name
    default = acc.launch(launch_fn.train_regression, 4, backend="ddp", nproc=2, output_dir="")
    assert default["lrs"] != one["lrs"]


def test_notebook_launcher_takes_accelerates_arguments():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    main = acc.notebook_launcher(launch_fn.describe_rank, args=("nb",), num_processes=2, mixed_precision="BF16",
                                 use_port=str(port))
    assert main["world"] == 2 and main["settings"]["backend"] == ["ddp", "detected"]
    assert main["settings"]["mixed_precision"] == ["bf16", "argument notebook_launcher(mixed_precision=...)"]
    assert main["settings"]["main_process_port"] == [port, "argument notebook_launcher(use_port=...)"]
    assert main["settings"]["nproc"] == [2, "argument notebook_launcher(num_processes=...)"]
    # one process runs the function here, as Accelerate's does
    assert acc.notebook_launcher(lambda: os.getpid(), num_processes=1) == os.getpid()


def test_debug_launcher_runs_cpu_processes():
    main = acc.debug_launcher(launch_fn.describe_rank, args=("dbg",))
    assert main["world"] == 2 and main["settings"]["cpu"][0] is True
    assert main["settings"]["backend"][0] == "ddp" and main["sum"] == 3.0
    assert acc.debug_launcher(launch_fn.describe_rank, args=("dbg",), num_processes=3)["sum"] == 6.0


def test_backend_fsdp_runs_fsdp():
    def train_fsdp():
        import torch

        from acc import Accelerator

        accelerator = Accelerator()
        model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 1))
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model, optimizer = accelerator.prepare(model, optimizer)
        loss = model(torch.ones(2, 4)).sum()
        accelerator.backward(loss)
        optimizer.step()
        sharded = any(hasattr(p, "full_tensor") for p in model.parameters())
        return str(accelerator.distributed_type), accelerator.backend, sharded

    assert acc.launch(train_fsdp, backend="fsdp", nproc=2, output_dir="") == ("DistributedType.FSDP", "fsdp", True)


def test_restarts_start_fresh_interpreters_for_an_importable_function_and_refuse_a_closure(tmp_path):
    with pytest.raises(acc.LaunchError, match=r"max_restarts=1.*`.*<locals>.*` is a lambda or is defined inside"):
        acc.launch(lambda: None, backend="ddp", nproc=2, max_restarts=1, output_dir="")
    marker = tmp_path / "failed-once"
    every = acc.launch(launch_fn.fail_once, str(marker), backend="ddp", nproc=2, max_restarts=1, return_all=True,
                       output_dir="")
    assert marker.read_text() == "failed once"
    assert [r["restart"] for r in every] == [1, 1] and [r["spawned"] for r in every] == [True, True]


def test_cuda_initialised_in_the_caller_is_refused_saying_what_and_what_to_do(monkeypatch, nothing_left_behind):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(acc.LaunchError) as info:
        acc.notebook_launcher(launch_fn.describe_rank, args=("x",), num_processes=2)
    text = str(info.value)
    assert "CUDA is already initialised in this process" in text and "Cannot re-initialize CUDA" in text
    assert "restart the kernel" in text and "inside the launched function" in text and "start_method='spawn'" in text
    assert started_since(nothing_left_behind) == []


def test_what_initialised_cuda_is_found_in_a_notebook_namespace():
    import torch

    from acc.launcher.notebook import cuda_culprits

    class OnGPU:
        device = torch.device("cuda", 0)

    namespace = {"In": ["", "import torch", "x = torch.ones(3)\nmodel = model.to('cuda')"], "state": OnGPU(),
                 "cpu_tensor": torch.ones(1)}
    found = cuda_culprits(namespace)
    assert "`state` (a OnGPU on cuda:0)" in found
    assert "cell In[2] line 2: model = model.to('cuda')" in found
    assert not any("cpu_tensor" in f for f in found)


def _script(mode: str, tmp_path: Path, **popen) -> subprocess.Popen:
    out = tmp_path / f"out-{mode}"
    return subprocess.Popen([sys.executable, str(WORKERS / "launch_fn.py"), mode, str(out)], cwd=tmp_path,
                            env=clean_env(tmp_path, ACC_OUTPUT_DIR=""), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _result(proc: subprocess.Popen, tmp_path: Path, mode: str, timeout: float = 180) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, out + err
    return json.loads((tmp_path / f"out-{mode}" / "result.json").read_text())


def test_from_a_plain_script_functions_of_main_return_values(tmp_path):
    result = _result(_script("values", tmp_path), tmp_path, "values")
    me = result["launcher_pid"]
    assert result["main"]["rank"] == 0 and result["main"]["tag"] == "first" and result["main"]["ppid"] == me
    assert [r["rank"] for r in result["all"]] == [0, 1] and {r["sum"] for r in result["all"]} == {3.0}
    assert result["lambda"] == [me, me]


def test_from_a_plain_script_a_failure_is_raised_and_the_next_launch_works(tmp_path):
    result = _result(_script("fail", tmp_path), tmp_path, "fail")
    assert (result["rank"], result["exitcode"], result["error"]) == (1, 1, "ValueError: bad batch on rank 1")
    assert 'raise ValueError("bad batch on rank 1")' in result["traceback"]
    assert result["after"]["tag"] == "after a failure" and result["after"]["world"] == 2


def _interruptible_launch(tmp_path):
    """The 'interrupt' script started in a session of its own, once both its workers are running: (the launching
    process, the workers' pids)."""
    proc = _script("interrupt", tmp_path, start_new_session=True)
    out = tmp_path / "out-interrupt"
    if not wait_for_text([out / "pid0", out / "pid1"], timeout=90, ended=[proc], complete=is_pid):
        proc.kill()
        pytest.fail(f"the workers never wrote their pids: {proc.communicate()}")
    return proc, [int((out / f"pid{r}").read_text()) for r in (0, 1)]


def test_from_a_plain_script_sigint_stops_every_worker_and_the_next_launch_works(tmp_path):
    proc, workers = _interruptible_launch(tmp_path)
    sent = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal does: the whole foreground group
    wait_for_exit(workers, timeout=20)
    assert not any(alive(pid) for pid in workers), "a worker outlived the interrupt"
    assert time.monotonic() - sent < 15
    result = _result(proc, tmp_path, "interrupt")
    assert result["interrupted"] is True and result["after"]["tag"] == "after an interrupt"
    assert result["after"]["pid"] not in workers


def test_from_a_plain_script_sigint_to_the_launcher_alone_stops_the_workers(tmp_path):
    proc, workers = _interruptible_launch(tmp_path)
    proc.send_signal(signal.SIGINT)  # only the launching process: the agent stops its workers
    result = _result(proc, tmp_path, "interrupt")
    assert result["interrupted"] is True and result["after"]["world"] == 2
    assert not any(alive(pid) for pid in workers)


def test_sigint_landing_inside_torchs_metric_timer_is_still_a_keyboard_interrupt(tmp_path):
    """torch's `metrics.prof` reads its clock inside `try` and uses the reading in `finally`: a signal raised
    between the two turns into an UnboundLocalError (a notebook interrupt failed a CI run so). The launch still
    stops every worker and raises KeyboardInterrupt."""
    result = _result(_script("interrupt-in-clock", tmp_path), tmp_path, "interrupt-in-clock")
    assert result.get("interrupted") is True, result
    wait_for_exit(result["workers"], timeout=20)
    assert not any(alive(pid) for pid in result["workers"])


def test_from_a_plain_script_sigterm_stops_the_workers_then_ends_the_program_as_it_would_have(tmp_path):
    proc, workers = _interruptible_launch(tmp_path)
    proc.send_signal(signal.SIGTERM)
    out_text, err = proc.communicate(timeout=60)
    assert proc.returncode == -signal.SIGTERM, out_text + err  # the program's own disposition: terminated
    assert not any(alive(pid) for pid in workers)
    assert not (tmp_path / "out-interrupt" / "result.json").exists()


def test_from_a_plain_script_sources_and_dry_run(tmp_path):
    (tmp_path / "acc.toml").write_text('mixed_precision = "bf16"\n')
    result = _result(_script("sources", tmp_path), tmp_path, "sources")
    s = result["main"]["settings"]
    assert s["gradient_accumulation_steps"] == [3, "argument acc.launch(gradient_accumulation_steps=...)"]
    assert s["mixed_precision"] == ["bf16", f"project file {tmp_path / 'acc.toml'}"]
    assert s["backend"] == ["ddp", "detected"]
    assert "function __main__.describe_rank(*args), forked from this process" in result["dry_run"]


def test_notebook_launcher_across_two_machines_meets_at_master_addr_and_use_port(tmp_path):
    """num_nodes=2 on this host (two launching programs, one process each, the backend from ACC_BACKEND):
    Accelerate's defaults there (master_addr 127.0.0.1, the static rendezvous) apply, with the roll call acc launch
    makes across machines."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = str(sock.getsockname()[1])
    procs = []
    for node in (0, 1):
        out = tmp_path / f"out-nodes-{node}"
        procs.append(subprocess.Popen([sys.executable, str(WORKERS / "launch_fn.py"), "nodes", str(out), str(node),
                                       port], cwd=tmp_path,
                                      env=clean_env(tmp_path, ACC_OUTPUT_DIR="", ACC_BACKEND="ddp"),
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        ended = [proc.communicate(timeout=180) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    results = []
    for node, (proc, (out, err)) in enumerate(zip(procs, ended)):
        assert proc.returncode == 0, out + err
        results.append(json.loads((tmp_path / f"out-nodes-{node}" / "result.json").read_text())["main"])
        assert f"machine {node} of 2" in err  # the roll call said where the main process runs
    assert [r["rank"] for r in results] == [0, 1] and {r["world"] for r in results} == {2}
    assert results[0]["sum"] == 3.0
    assert results[0]["settings"]["main_process_port"] == [int(port), "argument notebook_launcher(use_port=...)"]
    assert results[1]["settings"]["backend"] == ["ddp", "env ACC_BACKEND"]


def test_import_acc_stays_torch_free_and_acc_launch_is_callable():
    code = ("import sys, inspect, acc; assert 'torch' not in sys.modules; "
            "assert callable(acc.launch) and 'return_all' in inspect.signature(acc.launch).parameters; "
            "acc.notebook_launcher, acc.debug_launcher, acc.WorkerFailedError; import acc.contract.launch_plan; "
            "assert 'torch' not in sys.modules; print('ok')")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert proc.stdout.strip() == "ok", proc.stderr
