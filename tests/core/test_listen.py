"""Where a launch listens (acc.launcher.listen), without starting a run: the address chosen from the settings, the
variables that bind gloo and NCCL, the words of the dry run, and the errors of a bad address. The real sockets of real
runs: tests/integration/test_security.py."""

from __future__ import annotations

import socket

import pytest

from acc.errors import LaunchError
from acc.launcher import listen
from acc.launcher.plans import elastic_plan

BASE = {"num_machines": 1, "machine_rank": 0, "main_process_ip": None, "main_process_port": None,
        "rdzv_backend": "c10d", "rdzv_timeout": 900.0, "max_restarts": 0, "nproc": 2, "listen_address": None}


def settings(**changes):
    return {**BASE, **changes}


@pytest.fixture(autouse=True)
def _no_interface_chosen(monkeypatch):
    for name in ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME"):
        monkeypatch.delenv(name, raising=False)


def test_one_machine_listens_on_loopback_through_the_static_rendezvous():
    plan = elastic_plan(settings(), "cpu")
    assert plan.rendezvous.backend == "static" and plan.rendezvous.endpoint == "127.0.0.1:0"
    assert plan.rendezvous.listen == "127.0.0.1" and "one machine" in plan.rendezvous.listen_why
    lo = listen.loopback_interface()
    assert plan.env == {"GLOO_SOCKET_IFNAME": lo, "NCCL_SOCKET_IFNAME": lo}
    words = listen.describe(plan, env={})
    assert words.startswith("loopback only: the rendezvous store on 127.0.0.1:PORT (a free port, picked at start)")
    assert f"process group on interface {lo} (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME)" in words


def test_a_variable_the_user_set_wins(monkeypatch):
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth7")
    plan = elastic_plan(settings(), "cpu")
    assert "GLOO_SOCKET_IFNAME" not in plan.env and "NCCL_SOCKET_IFNAME" in plan.env
    assert "on interface eth7 (GLOO_SOCKET_IFNAME, NCCL_SOCKET_IFNAME, set by you)" in \
        listen.describe(plan, env={"GLOO_SOCKET_IFNAME": "eth7"})


@pytest.mark.parametrize("given, listens, connects", [("0.0.0.0", "0.0.0.0", "127.0.0.1"), ("127.0.0.1", "127.0.0.1",
                                                                                            "127.0.0.1")])
def test_a_listen_address_is_honoured(given, listens, connects):
    plan = elastic_plan(settings(listen_address=given), "cpu")
    assert plan.rendezvous.listen == listens and plan.rendezvous.endpoint == f"{connects}:0"
    if given == "0.0.0.0":  # every interface, as asked: torch chooses gloo's interface as it would
        assert plan.env == {} and listen.describe(plan, env={}).startswith("every interface:")


def test_star_means_every_interface():
    address, why = listen.choose(settings(listen_address="*"))
    assert address in ("::", "0.0.0.0") and why.startswith("every interface, as asked")


def test_across_machines_machine_0_listens_on_the_main_address_only():
    plan = elastic_plan(settings(num_machines=2, main_process_ip="127.0.0.1", main_process_port=29511), "cpu")
    assert plan.rendezvous.listen == "127.0.0.1" and plan.rendezvous.endpoint == "127.0.0.1:29511"
    assert plan.env == {"GLOO_SOCKET_IFNAME": listen.loopback_interface()}  # NCCL keeps choosing its own
    assert "the rendezvous store on 127.0.0.1:29511 only (--main-process-ip 127.0.0.1, an address of machine 0" in \
        listen.describe(plan, env={})
    other = elastic_plan(settings(num_machines=2, machine_rank=1, main_process_ip="127.0.0.1"), "cpu")
    assert listen.describe(other, env={}).startswith("no store here (machine 0 hosts it at 127.0.0.1:29500)")


def test_a_host_name_is_resolved_to_find_its_interface():
    assert listen.interface_of("localhost") == listen.loopback_interface()
    assert listen.numeric("localhost") in ("127.0.0.1", "::1") and listen.numeric("acc-no-such-host.invalid") is None


def test_a_main_address_that_does_not_resolve_is_asked_again_later():
    address, why = listen.main_machine_address("acc-no-such-host.invalid")
    assert address is None and "none found: it does not resolve" in why


def test_binding_an_address_of_another_machine_says_which_addresses_this_one_has():
    with pytest.raises(LaunchError) as info:
        listen.bind("192.0.2.254", 0)
    message = str(info.value)
    assert "cannot listen on 192.0.2.254: it is not an address of this machine (its addresses: 127.0.0.1" in message
    assert "--listen-address ADDRESS" in message


def test_a_taken_port_is_named():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        with pytest.raises(LaunchError, match=f"port {port} is already in use on 127.0.0.1"):
            listen.bind("127.0.0.1", port)


def test_the_bound_socket_listens_where_asked_only():
    sock = listen.bind("127.0.0.1", 0)
    try:
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
    finally:
        sock.close()


def test_one_task_per_process_says_that_torch_opens_the_store():
    from dataclasses import replace

    plan = elastic_plan(settings(), "cpu")
    task = replace(plan, engine="task", env={**plan.env, "RANK": "0"})
    assert listen.describe(task, env={}).startswith("torch's store, opened by init_process_group in this process "
                                                    "(rank 0) on every interface")
    assert listen.describe(task, env={"TORCHELASTIC_USE_AGENT_STORE": "True"}).startswith(
        "no store here (the launcher that started this process serves it")
    assert listen.describe(replace(task, env={"RANK": "1"}), env={}).startswith("no store here (rank 0 hosts it")
