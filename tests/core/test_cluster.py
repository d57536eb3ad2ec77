"""The kernel's side of cluster environments (acc.assembly.clusters): asking the plugins, the settings source between ACC_*
variables and config files, contradictions, the plan of one task per process, the checks before the rendezvous,
and the dry run. The schedulers' own plugins are tested in tests/plugins/clusters."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest
from click.testing import CliRunner

from acc import cluster
from acc.assembly.choose import assemble
from acc.assembly.plugins import new_plugin_manager, register
from acc.cli import cli
from acc.cluster import ClusterEnvironment, ClusterError
from acc.contract.launch_plan import LaunchPlan, Rendezvous
from acc.errors import LaunchError, PluginError, ValidationError
from acc.launcher import preflight
from acc.launcher.plans import elastic_plan

# srun -N2 --ntasks-per-node=1, seen from node 1 (the variables the slurm plugin reads)
SLURM_NODE_1 = {"SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_NODES": "2",
                "SLURM_STEP_NODELIST": "localhost,nodeb", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_NODEID": "1",
                "SLURM_PROCID": "1", "SLURM_LOCALID": "0"}


def plugin(answer, name="fake"):
    module = types.ModuleType(f"acc_test_cluster_{name}")
    module.ACC_HOOKSPEC_VERSION = 2

    @cluster.hookimpl
    def acc_cluster_environment(environ, hostname):
        return answer(environ, hostname) if callable(answer) else answer

    module.acc_cluster_environment = acc_cluster_environment
    return module


def manager(**answers):
    pm = new_plugin_manager()
    for name, answer in answers.items():
        register(pm, plugin(answer, name), name)
    return pm


def env(**kw):
    base = dict(label="test job", num_machines=4, machine_rank=1, main_address="n1", main_port=12345,
                sources={"num_machines": "N=4", "machine_rank": "R=1", "main_address": "A=n1", "main_port": "P"})
    base.update(kw)
    return ClusterEnvironment(**base)


# --------------------------------------------------------------------------- asking the plugins


def test_the_most_specific_active_environment_wins_and_the_others_are_named():
    pm = manager(low=env(precedence=10), high=env(label="mpirun", precedence=30), off=None)
    found = cluster.detect({}, hostname="h", pm=pm)
    assert (found.name, found.label, found.also_active) == ("high", "mpirun", ("low (test job)",))
    assert found.source("num_machines") == "high N=4"
    assert cluster.detect({}, hostname="h", pm=manager(off=None)) is None


def test_the_plugin_receives_the_environment_and_host_name():
    seen = {}
    cluster.detect({"X": "1"}, hostname="node7", pm=manager(spy=lambda e, h: seen.update(environ=e, host=h)))
    assert seen == {"environ": {"X": "1"}, "host": "node7"}


def test_a_malformed_answer_is_an_error_naming_the_plugin():
    with pytest.raises(PluginError, match="cluster environment 'odd' answered acc_cluster_environment with dict, "
                                          "not an acc.cluster.ClusterEnvironment"):
        cluster.detect({}, hostname="h", pm=manager(odd={"machines": 2}))
    with pytest.raises(ClusterError, match=r"cluster environment 'bad' \(test job\) describes no launch: machine_rank "
                                           r"7 \(R=1\) is outside 0..3"):
        cluster.detect({}, hostname="h", pm=manager(bad=env(machine_rank=7)))
    with pytest.raises(ClusterError, match=r"rank 9 \(\?\) is outside 0..7 \(4 machines x 2 processes\)"):
        cluster.detect({}, hostname="h", pm=manager(bad=env(nproc=2, rank=9, local_rank=0)))


def test_a_plugins_own_error_is_prefixed_with_its_name_and_how_to_turn_it_off():
    def fails(environ, hostname):
        raise ClusterError("X_NODES='q' is not a whole number")

    with pytest.raises(ClusterError, match=r"^cluster environment 'sched': X_NODES='q' is not a whole number "
                                           r"\(-p no:sched ignores this scheduler\)$"):
        cluster.detect({}, hostname="h", pm=manager(sched=fails))
    # but another environment that describes the launch is used, and the failing one named
    found = cluster.detect({}, hostname="h", pm=manager(sched=fails, other=env()))
    assert found.name == "other" and found.also_active == ("sched (its variables describe no launch)",)


def test_two_active_at_the_same_precedence_is_an_error_naming_both():
    with pytest.raises(ClusterError, match="two cluster environments are active at once: 'a' .* and 'b' .*"
                                           "-p no:b"):
        cluster.detect({}, hostname="h", pm=manager(a=env(), b=env()))


# --------------------------------------------------------------------------- the settings chain


def test_cluster_values_sit_between_acc_variables_and_config_files(tmp_path):
    (tmp_path / "acc.toml").write_text("num_machines = 1\nmain_process_port = 999\nnproc = 3\n")
    a = assemble(environ={**os.environ, **SLURM_NODE_1, "ACC_MAIN_PROCESS_PORT": "4000"}, cwd=tmp_path, cluster=True)
    s = a.settings
    assert (s["num_machines"], s.source("num_machines")) == (2, "slurm SLURM_STEP_NUM_NODES=2")  # beats the file
    assert (s["machine_rank"], s.source("machine_rank")) == (1, "slurm SLURM_NODEID=1")
    assert (s["main_process_ip"], s.source("main_process_ip")) == \
        ("localhost", "slurm first host of SLURM_STEP_NODELIST=localhost,nodeb")
    # where machine 0 listens is a choice, not a fact of the allocation: a variable or flag overrides it
    assert (s["main_process_port"], s.source("main_process_port")) == (4000, "env ACC_MAIN_PROCESS_PORT")
    assert (s["nproc"], s.source("nproc")[:12]) == (3, "project file")  # slurm does not fix it: the file's holds
    assert a.cluster.name == "slurm"
    # without cluster=True (a worker, acc.launch(fn), acc config) nothing is read from the scheduler
    assert assemble(environ={**os.environ, **SLURM_NODE_1}, cwd=tmp_path).settings.source("num_machines") != \
        "slurm SLURM_STEP_NUM_NODES=2"


def test_a_flag_or_variable_that_contradicts_the_scheduler_is_an_error_naming_both(tmp_path):
    environ = {**os.environ, **SLURM_NODE_1, "ACC_MACHINE_RANK": "0"}
    with pytest.raises(ValidationError) as info:
        assemble(flags={"num_machines": "4"}, environ=environ, cwd=tmp_path, cluster=True)
    problems = info.value.problems
    assert problems == [
        "num_machines 4 (from flag --num-machines) contradicts SLURM job 4242, step 0: 2 (from slurm "
        "SLURM_STEP_NUM_NODES=2); leave out --num-machines (acc reads it from slurm), change the allocation, or ignore the "
        "scheduler with -p no:slurm",
        "machine_rank 0 (from env ACC_MACHINE_RANK) contradicts SLURM job 4242, step 0: 1 (from slurm SLURM_NODEID=1); "
        "leave out ACC_MACHINE_RANK (acc reads it from slurm), change the allocation, or ignore the scheduler with "
        "-p no:slurm"]
    # the same values agree: no error, the flag is named as the source
    same = assemble(flags={"num_machines": "2"}, environ={**os.environ, **SLURM_NODE_1}, cwd=tmp_path, cluster=True)
    assert same.settings.source("num_machines") == "flag --num-machines"


def test_a_contradicting_process_count_under_one_task_per_process_says_what_each_means(tmp_path):
    environ = {**os.environ, **SLURM_NODE_1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3",
               "SLURM_LOCALID": "1"}
    with pytest.raises(ValidationError, match=r"nproc 8 \(from flag --nproc\) contradicts SLURM job 4242, step 0: 2 "
                                              r"\(from slurm SLURM_STEP_TASKS_PER_NODE=2\(x2\)\); slurm started 2 "
                                              r"processes on each machine itself, one per task"):
        assemble(flags={"nproc": "8"}, environ=environ, cwd=tmp_path, cluster=True)


# --------------------------------------------------------------------------- one task per process


def settings_for(environ, tmp_path, **flags):
    return assemble(flags={"backend": "ddp", **flags}, environ={**os.environ, **environ}, cwd=tmp_path,
                    cluster=True)


def test_the_plan_of_one_task_per_process(tmp_path):
    a = settings_for({**SLURM_NODE_1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3",
                      "SLURM_LOCALID": "1"}, tmp_path)
    plan = cluster.task_plan(elastic_plan(a.settings, device="cpu"), a.cluster, a.settings)
    assert plan.engine == "task" and plan.world_size == 4 and plan.machine_rank == 1
    assert {k: plan.env[k] for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                     "MASTER_ADDR")} == \
        {"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
         "MASTER_ADDR": "localhost"}
    assert plan.env["MASTER_PORT"] == str(a.settings["main_process_port"]) and plan.problems() == []
    with pytest.raises(LaunchError, match="the ddp backend starts its processes with the 'pjrt' engine, which cannot "
                                          "run as one process per slurm task"):
        cluster.task_plan(LaunchPlan(engine="pjrt"), a.cluster, a.settings)


def test_restarts_cannot_be_asked_of_processes_the_scheduler_started(tmp_path):
    a = settings_for({**SLURM_NODE_1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3",
                      "SLURM_LOCALID": "1"}, tmp_path, max_restarts="2")
    [problem] = cluster.kernel_problems(a.settings, a.cluster)
    assert problem.startswith("max_restarts 2 (from flag --max-restarts): slurm started every process itself")


def test_a_task_that_sees_fewer_gpus_than_the_machine_runs_tasks_is_refused_saying_why(tmp_path, monkeypatch):
    monkeypatch.setenv("ACC_HARDWARE", '{"cuda": 1}')  # as with --gpus-per-task=1: each task sees one GPU
    a = settings_for({**SLURM_NODE_1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3",
                      "SLURM_LOCALID": "1"}, tmp_path)
    assert cluster.kernel_problems(a.settings, a.cluster) == [
        "slurm started 2 processes on this machine, one per task, but this task sees 1 CUDA device(s); each task "
        "takes cuda:<local rank> of the machine's devices, so let every task see all of them (no per-task GPU "
        "binding), or start one task per machine"]
    monkeypatch.setenv("ACC_HARDWARE", '{"cuda": 2}')
    assert cluster.kernel_problems(a.settings, a.cluster) == []


# --------------------------------------------------------------------------- checks before the rendezvous


class Settings(dict):
    def source(self, name):
        return f"test {name}"


def plan_at(host, port, machine_rank=1, engine="elastic", env=None):
    return LaunchPlan(engine=engine, nproc_per_machine=1, num_machines=2, machine_rank=machine_rank,
                      rendezvous=Rendezvous(endpoint=f"{host}:{port}"), env=env or {})


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class FakeClock:
    """The preflight's time: it passes only when the code under test sleeps (or a fake connection attempt waits out
    its timeout), so the retries and the timeouts are asserted exactly, without waiting for them."""

    def __init__(self, now=100.0):
        self.now = now
        self.slept = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        assert seconds >= 0, seconds
        self.slept.append(seconds)
        self.now += seconds


def timing_out(clock, attempts, after=None):
    """A connection attempt that waits out its whole timeout on `clock` and times out, as towards an address that
    drops the packets; the attempt number `after` (0 the first) is refused instead (machine 0 answered)."""

    def connect(address, timeout):
        attempts.append((address, timeout))
        if len(attempts) - 1 == after:
            raise ConnectionRefusedError(111, "Connection refused")
        clock.now += timeout
        raise socket.timeout("timed out")

    return connect


@pytest.mark.parametrize("rdzv_timeout, pauses", [(1.5, [0.5, 0.5, 0.5]), (1.2, [0.5, 0.5, 0.2])])
def test_a_main_address_that_does_not_resolve_is_one_line_after_the_rdzv_timeout(rdzv_timeout, pauses):
    said, clock = [], FakeClock()
    started = clock()
    with pytest.raises(LaunchError) as info:
        preflight.run(plan_at("acc-no-such-host.invalid", 1234), Settings(main_process_ip="x",
                                                                            rdzv_timeout=rdzv_timeout),
                      say=said.append, clock=clock, sleep=clock.sleep)
    message = str(info.value)
    # retried every PAUSE, the last pause cut to the deadline, and gave up at the rdzv timeout: no sooner, no later
    assert clock.slept == pytest.approx(pauses) and clock() - started == pytest.approx(rdzv_timeout)
    assert "\n" not in message, message
    assert message.startswith("main address acc-no-such-host.invalid (from test main_process_ip) does not resolve on "
                              "this machine (machine 1 of 2): ")
    assert (f"; tried for {rdzv_timeout:.1f} s (--rdzv-timeout {rdzv_timeout:g}). Check the name, or give machine 0's "
            "address with --main-process-ip") in message
    assert len(said) == 1 and "does not resolve yet" in said[0] and f"retrying for up to {rdzv_timeout:g} s" in said[0]


def test_a_refused_connection_proves_the_main_address_reachable():
    port = free_port()
    line = preflight.run(plan_at("127.0.0.1", port), Settings(main_process_ip="127.0.0.1", rdzv_timeout=5))
    assert line.startswith("before the rendezvous (machine 1 of 2): main address 127.0.0.1 (from test "
                           "main_process_ip) resolved to 127.0.0.1 in ")
    assert f"; 127.0.0.1:{port} answered (refused: nothing listens there yet) in " in line
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        line = preflight.run(plan_at("127.0.0.1", port), Settings(main_process_ip="127.0.0.1", rdzv_timeout=5))
    assert f"127.0.0.1:{port} answered (the store is up) in " in line


def test_an_address_that_never_answers_is_one_line_naming_it():
    """Every connection attempt times out, as behind a firewall that drops the packets: one attempt that may take the
    whole rdzv timeout (under ATTEMPT), then one line naming the address, the port and the time tried."""
    clock, attempts, port = FakeClock(), [], 29400
    started = clock()
    with pytest.raises(LaunchError) as info:
        preflight.run(plan_at("127.0.0.1", port), Settings(main_process_ip="127.0.0.1", rdzv_timeout=1.5),
                      say=pytest.fail, clock=clock, sleep=clock.sleep, connect=timing_out(clock, attempts))
    assert attempts == [(("127.0.0.1", port), 1.5)] and clock.slept == [] and clock() - started == 1.5
    assert str(info.value) == (
        f"main address 127.0.0.1 (from test main_process_ip, resolved to 127.0.0.1) is not reachable from this machine "
        f"(machine 1 of 2): port {port}: no answer within 1.5 s (timed out); tried for 1.5 s (--rdzv-timeout 1.5). "
        f"Check that machine 0 is up at that address and that no firewall blocks port {port} between the machines")


def test_connection_attempts_are_capped_and_retried_until_the_rdzv_timeout():
    said, clock, attempts, port = [], FakeClock(), [], 29400
    started = clock()
    with pytest.raises(LaunchError) as info:
        preflight.run(plan_at("127.0.0.1", port), Settings(main_process_ip="127.0.0.1", rdzv_timeout=5),
                      say=said.append, clock=clock, sleep=clock.sleep, connect=timing_out(clock, attempts))
    # an attempt takes at most ATTEMPT (3 s), a PAUSE (0.5 s) between two, the last one cut to the deadline
    assert [timeout for _, timeout in attempts] == [3.0, 1.5] and clock.slept == [0.5]
    assert clock() - started == 5.0
    assert said == [f"main address 127.0.0.1 (from test main_process_ip, resolved to 127.0.0.1) does not answer yet "
                    f"on port {port} (no answer within 3.0 s (timed out)); retrying for up to 5 s (--rdzv-timeout)"]
    assert f"port {port}: no answer within 1.5 s (timed out); tried for 5.0 s (--rdzv-timeout 5)." in str(info.value)
    # machine 0 answering at the second attempt ends the retrying, and the line says how long it took
    said, clock, attempts = [], FakeClock(), []
    line = preflight.run(plan_at("127.0.0.1", port), Settings(main_process_ip="127.0.0.1", rdzv_timeout=5),
                         say=said.append, clock=clock, sleep=clock.sleep, connect=timing_out(clock, attempts, after=1))
    assert len(attempts) == 2 and clock.slept == [0.5] and len(said) == 1
    assert line.endswith(f"; 127.0.0.1:{port} answered (refused: nothing listens there yet) in 0.0 ms, after 3.5 s of "
                         "retrying"), line


def test_a_connection_that_a_full_backlog_drops_reads_as_no_answer():
    """Real sockets, so no bound on the time: a listener whose backlog is full drops new connections (SYN
    unanswered), and the attempt's timeout reads as no answer (an address outside the sandbox cannot be used: its
    proxy accepts every connection)."""
    with socket.socket() as server, socket.socket() as first:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        first.connect(("127.0.0.1", port))  # fills the backlog
        with pytest.raises(LaunchError) as info:
            preflight.run(plan_at("127.0.0.1", port), Settings(main_process_ip="127.0.0.1", rdzv_timeout=0.3),
                          say=lambda line: None)
    message = str(info.value)
    assert message.startswith("main address 127.0.0.1 (from test main_process_ip, resolved to 127.0.0.1) is not "
                              f"reachable from this machine (machine 1 of 2): port {port}: no answer within "), message
    assert " s (timed out); tried for " in message and "\n" not in message


def test_machine_0_and_rank_0_report_the_port_they_will_serve():
    port = free_port()
    line = preflight.run(plan_at("127.0.0.1", port, machine_rank=0), Settings(main_process_ip="127.0.0.1",
                                                                               rdzv_timeout=5), cluster=env())
    assert line.startswith("before the rendezvous (machine 0 of 2)")
    assert f"port {port} free here, where the store will be; 2 machine(s), as  allocated (N=4)" in line
    task = plan_at("127.0.0.1", port, machine_rank=0, engine="task", env={"RANK": "0"})
    assert preflight.hosts_store(task) and not preflight.hosts_store(
        plan_at("127.0.0.1", port, machine_rank=0, engine="task", env={"RANK": "1"}))


# --------------------------------------------------------------------------- the command line


def invoke(*args, env=None):
    return CliRunner().invoke(cli, list(args), env=env, catch_exceptions=False, prog_name="acc")


def test_the_dry_run_shows_the_cluster_and_each_value_with_its_source(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    out = invoke("launch", "--dry-run", "--backend", "ddp", "t.py", env=SLURM_NODE_1).output
    lines = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ") and len(line.split()) > 2}
    assert lines["num_machines"].split()[1:] == ["2", "slurm", "SLURM_STEP_NUM_NODES=2"]
    assert lines["machine_rank"].split()[1:] == ["1", "slurm", "SLURM_NODEID=1"]
    assert "  cluster     slurm: SLURM job 4242, step 0: 2 machine(s), this is machine 1; one launcher per machine" \
           in out
    assert "  checks      before the rendezvous: localhost (slurm first host of SLURM_STEP_NODELIST=localhost,nodeb) " \
           "resolves and localhost:" in out


def test_the_dry_run_of_one_task_per_process(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    environ = {**SLURM_NODE_1, "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_PROCID": "3", "SLURM_LOCALID": "1"}
    out = invoke("launch", "--dry-run", "--backend", "ddp", "t.py", env=environ).output
    assert "  engine      task: this process, one of the run's processes that a scheduler started" in out
    assert "  processes   2 per machine x 2 machine(s) = 4, this is machine 1" in out
    assert "  rank 0      the main process: the task with RANK 0 (slurm started it); this process is rank 3" in out
    assert "RANK=3" in out and "LOCAL_RANK=1" in out and "WORLD_SIZE=4" in out


def test_the_dry_run_under_a_scheduler_stays_torch_free(tmp_path):
    (tmp_path / "t.py").write_text("pass\n")
    code = ("import sys\nfrom acc.cli import main\ntry:\n    main(['launch', '--dry-run', '--backend', 'ddp', 't.py'])\n"
            "except SystemExit:\n    pass\nprint('LOADED', json.dumps(sorted(m for m in ('torch', 'acc_clusters.slurm')"
            " if m in sys.modules)))")
    proc = subprocess.run([sys.executable, "-c", "import json\n" + code], cwd=tmp_path, capture_output=True, text=True,
                          env={**os.environ, **SLURM_NODE_1}, timeout=60)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("LOADED")]
    assert line and json.loads(line[0][7:]) == ["acc_clusters.slurm"], proc.stdout + proc.stderr


def test_acc_plugins_says_which_cluster_environment_is_active():
    out = invoke("plugins", env=SLURM_NODE_1).output
    section = out.split("cluster environments (entry-point group acc.clusters):")[1].split("trackers (")[0]
    assert "  slurm  (acc-clusters 0.1.0)" in section and "    active    yes: SLURM job 4242, step 0" in section
    assert "    active    no" in section  # the others


def test_hookspec_is_part_of_contract_version_2():
    from acc.contract import hookspecs

    assert hookspecs.HOOKSPEC_VERSION == 2 and "acc_cluster_environment" not in hookspecs.SELECTION_HOOKS
    doc = hookspecs.acc_cluster_environment.__doc__
    assert "**Kind**: broadcast" in doc and "**Called by**" in doc and "**Default**" in doc
    assert Path(cluster.__file__).read_text().count("import torch") == 0
