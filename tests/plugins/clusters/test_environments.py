"""Each scheduler's plugin over recorded environments: SLURM's as slurm-wlm 22.05 set them on the test cluster
(recorded/slurm-22.05.json), the others as their operators and launchers document and set them."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from acc.assembly.clusters import ClusterError, cluster_manager, detect
from acc_clusters.variables import job_port, text_port

RECORDED = json.loads((Path(__file__).parent / "recorded" / "slurm-22.05.json").read_text())


@pytest.fixture(scope="module")
def pm():
    return cluster_manager()


def found(pm, environ, hostname="somehost"):
    return detect(environ, hostname=hostname, pm=pm)


def test_nothing_is_active_in_a_plain_shell(pm):
    assert found(pm, {"PATH": "/usr/bin", "HOME": "/root"}) is None
    # torchrun's variables outside Kubernetes and outside a torchrun worker are a user's leftovers, not a launch
    assert found(pm, {"MASTER_ADDR": "h", "MASTER_PORT": "1", "WORLD_SIZE": "2", "RANK": "0"}) is None


# --------------------------------------------------------------------------- SLURM, recorded


@pytest.mark.parametrize("task", [0, 1])
def test_slurm_one_launcher_per_node(pm, task):
    environ = RECORDED["per-node"][task]
    env = found(pm, environ)
    job = int(environ["SLURM_JOB_ID"])
    assert (env.name, env.num_machines, env.machine_rank, env.per_process) == ("slurm", 2, task, False)
    assert (env.main_address, env.main_port, env.nproc) == ("runsc", job_port(job, 0), None)
    assert env.source("main_address") == "slurm first host of SLURM_STEP_NODELIST=runsc,vm"
    assert env.source("num_machines") == "slurm SLURM_STEP_NUM_NODES=2"
    assert env.source("main_port") == f"slurm 12000 + (SLURM_JOB_ID={job} x 100 + SLURM_STEP_ID=0) mod 20000"


@pytest.mark.parametrize("task", [0, 1, 2, 3])
def test_slurm_one_task_per_process_on_two_nodes(pm, task):
    environ = RECORDED["per-task"][task]
    env = found(pm, environ)
    assert env.per_process and (env.rank, env.nproc, env.num_machines) == (task, 2, 2)
    assert env.local_rank == int(environ["SLURM_LOCALID"]) and env.machine_rank == int(environ["SLURM_NODEID"])
    assert env.main_address == "runsc" and env.source("nproc") == "slurm SLURM_STEP_TASKS_PER_NODE=2(x2)"
    assert any("--kill-on-bad-exit=1" in note for note in env.notes)


def test_slurm_one_node_several_tasks_meet_on_the_loopback(pm):
    env = found(pm, RECORDED["one-node"][1])
    assert env.per_process and (env.rank, env.local_rank, env.nproc, env.num_machines) == (1, 1, 2, 1)
    assert env.main_address == "127.0.0.1" and env.source("main_address") == "slurm one node: the loopback"


def test_slurm_batch_script_of_two_nodes_is_refused(pm):
    with pytest.raises(ClusterError) as info:
        found(pm, RECORDED["batch"][0])
    message = str(info.value)
    assert message.startswith("cluster environment 'slurm': acc launch runs outside srun (no SLURM_STEP_ID) in SLURM "
                              "job 11 of 2 nodes (SLURM_JOB_NUM_NODES=2)")
    assert "srun --ntasks-per-node=1 acc launch ..." in message and "-p no:slurm ignores this scheduler" in message


# --------------------------------------------------------------------------- SLURM, other shapes


def slurm_step(nodelist, nodes, tasks_per_node, node=0, procid=0, localid=0, **extra):
    return {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "3", "SLURM_STEP_NODELIST": nodelist,
            "SLURM_STEP_NUM_NODES": str(nodes), "SLURM_STEP_TASKS_PER_NODE": tasks_per_node,
            "SLURM_NODEID": str(node), "SLURM_PROCID": str(procid), "SLURM_LOCALID": str(localid), **extra}


@pytest.mark.parametrize("nodelist,nodes,first", [
    ("node[01-03,07]", 4, "node01"), ("a1,b[2-3]", 3, "a1"), ("gpu-[001-010]", 10, "gpu-001"),
    ("rack[1-2]-gpu[001-002]", 4, "rack1-gpu001"), ("n[009-011]", 3, "n009"),
])
def test_slurm_node_list_shapes(pm, nodelist, nodes, first):
    env = found(pm, slurm_step(nodelist, nodes, f"1(x{nodes})", node=nodes - 1, procid=nodes - 1))
    assert (env.num_machines, env.machine_rank, env.main_address) == (nodes, nodes - 1, first)
    assert env.main_port == job_port(77, 3) == 12000 + (77 * 100 + 3) % 20000


def test_slurm_master_addr_and_port_win(pm):
    env = found(pm, slurm_step("n[1-2]", 2, "1(x2)", MASTER_ADDR="10.0.0.9", MASTER_PORT="4000"))
    assert (env.main_address, env.main_port) == ("10.0.0.9", 4000)
    assert env.source("main_address") == "slurm MASTER_ADDR=10.0.0.9"


def test_slurm_one_node_one_task_needs_no_address(pm):
    env = found(pm, slurm_step("n1", 1, "1"))
    assert (env.num_machines, env.main_address, env.main_port, env.per_process) == (1, None, None, False)


@pytest.mark.parametrize("change,fragment", [
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x2),1", "SLURM_STEP_NUM_NODES": "3", "SLURM_STEP_NODELIST": "n[1-3]"},
     "the nodes run different numbers of tasks (SLURM_STEP_TASKS_PER_NODE='2(x2),1'); acc starts the same number of "
     "processes on every machine: srun --ntasks-per-node=N"),
    ({"SLURM_STEP_NODELIST": "n[1-3]"}, "SLURM_STEP_NODELIST='n[1-3]' names 3 host(s) but SLURM_STEP_NUM_NODES=2"),
    ({"SLURM_NODEID": "x"}, "SLURM_NODEID='x' is not a whole number"),
    ({"SLURM_STEP_NODELIST": "n[2-1]"}, "host list 'n[2-1]': range '2-1' runs backwards"),
    ({"SLURM_NODEID": "5"}, "machine_rank 5 (SLURM_NODEID=5) is outside 0..1"),
])
def test_slurm_variables_that_describe_no_launch(pm, change, fragment):
    with pytest.raises(ClusterError) as info:
        found(pm, {**slurm_step("n[1-2]", 2, "1(x2)"), **change})
    assert fragment in str(info.value)


def test_slurm_batch_script_of_one_node_is_one_machine(pm):
    env = found(pm, {"SLURM_JOB_ID": "5", "SLURM_JOB_NUM_NODES": "1", "SLURM_NODEID": "0"})
    assert (env.num_machines, env.machine_rank, env.main_address, env.per_process) == (1, 0, None, False)
    assert env.label == "SLURM job 5 (outside srun, one node)"


# --------------------------------------------------------------------------- Kubeflow and torchrun-style

POD = {"KUBERNETES_SERVICE_HOST": "10.96.0.1", "PYTHONUNBUFFERED": "0"}


def test_pytorchjob_of_the_older_operator_counts_pods(pm):
    env = found(pm, {**POD, "MASTER_ADDR": "mnist-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "3",
                     "RANK": "2"})
    assert (env.name, env.num_machines, env.machine_rank, env.main_address, env.main_port, env.nproc) == \
        ("kubeflow", 3, 2, "mnist-master-0", 23456, None)
    assert env.source("num_machines") == "kubeflow WORLD_SIZE=3 (pods)"


def test_pytorchjob_with_nproc_per_node_counts_processes_in_world_size(pm):
    """The training-operator since nprocPerNode: WORLD_SIZE = pods x nprocPerNode, RANK = the pod's index."""
    env = found(pm, {**POD, "MASTER_ADDR": "job-master-0", "MASTER_PORT": "23456", "WORLD_SIZE": "12", "RANK": "2",
                     "PET_NPROC_PER_NODE": "4", "PET_NODE_RANK": "2", "PET_NNODES": "3"})
    assert (env.num_machines, env.machine_rank, env.nproc, env.main_address, env.main_port) == \
        (3, 2, 4, "job-master-0", 23456)
    assert not env.per_process and env.source("nproc") == "kubeflow PET_NPROC_PER_NODE=4"


def test_trainjob_pet_variables_with_auto_processes(pm):
    env = found(pm, {**POD, "PET_NNODES": "2", "PET_NPROC_PER_NODE": "auto", "PET_NODE_RANK": "1",
                     "PET_MASTER_ADDR": "myjob-node-0-0.myjob", "PET_MASTER_PORT": "29400"})
    assert (env.num_machines, env.machine_rank, env.nproc, env.main_address, env.main_port) == \
        (2, 1, None, "myjob-node-0-0.myjob", 29400)


def test_an_elastic_range_is_refused_unless_fixed(pm):
    base = {**POD, "PET_NODE_RANK": "0", "PET_MASTER_ADDR": "m", "PET_MASTER_PORT": "1"}
    with pytest.raises(ClusterError, match="PET_NNODES='1:4' is an elastic range; acc runs a fixed number of"):
        found(pm, {**base, "PET_NNODES": "1:4"})
    assert found(pm, {**base, "PET_NNODES": "2:2"}).num_machines == 2


def test_a_process_torchrun_started_is_one_worker_whose_store_is_served(pm):
    env = found(pm, {"TORCHELASTIC_RUN_ID": "abc", "TORCHELASTIC_USE_AGENT_STORE": "True", "RANK": "3",
                     "LOCAL_RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
                     "MASTER_ADDR": "h0", "MASTER_PORT": "29500"})
    assert env.per_process and env.store_ready
    assert (env.rank, env.local_rank, env.nproc, env.num_machines, env.machine_rank) == (3, 1, 2, 2, 1)


# --------------------------------------------------------------------------- LSF


def test_lsf_hosts_in_order_and_this_hosts_index(pm):
    environ = {"LSB_JOBID": "777", "LSB_MCPU_HOSTS": "hostA 4 hostB 4 hostC 4"}
    env = found(pm, environ, hostname="hostB.cluster.example")
    assert (env.name, env.num_machines, env.machine_rank, env.main_address, env.main_port) == \
        ("lsf", 3, 1, "hostA", job_port(777))
    assert env.source("machine_rank") == "lsf this host (hostB.cluster.example) in LSB_MCPU_HOSTS=hostA 4 hostB 4 " \
                                         "hostC 4"
    assert found(pm, {"LSB_JOBID": "8", "LSB_HOSTS": "h1 h1 h2 h2"}, hostname="h2").machine_rank == 1
    assert found(pm, {"LSB_JOBID": "8", "LSB_HOSTS": "h1 h1"}, hostname="h1").num_machines == 1


def test_lsf_on_a_host_outside_the_job_is_an_error(pm):
    with pytest.raises(ClusterError, match=r"this machine \(other\) is not among the job's hosts \(LSB_MCPU_HOSTS="):
        found(pm, {"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a 1 b 1"}, hostname="other")
    with pytest.raises(ClusterError, match="is not 'host slots host slots ...'"):
        found(pm, {"LSB_JOBID": "1", "LSB_MCPU_HOSTS": "a 1 b"}, hostname="a")


# --------------------------------------------------------------------------- MPI


def test_openmpi_processes_on_two_machines(pm):
    env = found(pm, {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "1", "MASTER_ADDR": "h0", "PMIX_NAMESPACE": "prterun-h0-1234@1"})
    assert env.name == "mpi" and env.per_process
    assert (env.rank, env.local_rank, env.nproc, env.num_machines, env.machine_rank) == (3, 1, 2, 2, 1)
    assert (env.main_address, env.main_port) == ("h0", text_port("prterun-h0-1234@1"))


def test_mpich_hydra_on_one_machine_meets_on_the_loopback(pm):
    env = found(pm, {"PMI_SIZE": "2", "PMI_RANK": "1", "MPI_LOCALNRANKS": "2", "MPI_LOCALRANKID": "1"})
    assert env.per_process and (env.main_address, env.num_machines, env.main_port) == ("127.0.0.1", 1, None)


def test_mpi_one_process_per_machine_is_a_launcher_and_names_the_missing_address(pm):
    env = found(pm, {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
                     "OMPI_COMM_WORLD_LOCAL_RANK": "0"})
    assert not env.per_process and (env.num_machines, env.machine_rank, env.main_address) == (2, 1, None)
    assert "mpirun -x MASTER_ADDR=<host>" in env.notes[0]


def test_mpi_ranks_mapped_round_robin_are_refused(pm):
    with pytest.raises(ClusterError, match=r"the ranks are not consecutive on each machine.*--map-by slot"):
        found(pm, {"OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "0"})


# --------------------------------------------------------------------------- several at once


def test_mpirun_inside_a_slurm_batch_script_is_mpis_launch(pm):
    environ = {**RECORDED["batch"][0], "SLURM_JOB_NUM_NODES": "1", "SLURM_NNODES": "1",
               "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
               "OMPI_COMM_WORLD_LOCAL_RANK": "0"}
    env = found(pm, environ)
    assert env.name == "mpi" and env.also_active == ("slurm (SLURM job 11 (outside srun, one node))",)


def test_mpirun_in_the_batch_script_of_two_slurm_nodes_is_mpis_launch(pm):
    """SLURM alone would refuse its batch script of two nodes; mpirun started these processes, so its view holds."""
    environ = {**RECORDED["batch"][0], "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_RANK": "2",
               "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0", "MASTER_ADDR": "runsc"}
    env = found(pm, environ)
    assert (env.name, env.num_machines, env.machine_rank, env.rank) == ("mpi", 2, 1, 2)
    assert env.also_active == ("slurm (its variables describe no launch)",)


def test_two_schedulers_at_the_same_precedence_are_an_error_naming_both(pm):
    environ = {**slurm_step("n[1-2]", 2, "1(x2)"), "LSB_JOBID": "1", "LSB_HOSTS": "a"}
    with pytest.raises(ClusterError) as info:
        found(pm, environ, hostname="a")
    assert "two cluster environments are active at once: " in str(info.value)
    assert "'lsf'" in str(info.value) and "'slurm'" in str(info.value) and "-p no:" in str(info.value)


def test_a_blocked_environment_is_not_asked():
    assert detect(RECORDED["per-node"][0], hostname="x", blocked=["slurm"]) is None
