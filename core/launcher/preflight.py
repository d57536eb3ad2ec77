"""Checks before the rendezvous of a launch across machines (or of processes a scheduler started): the main address
resolves and answers, the port is free where the store will be, the machine count is the allocation's. Each result
is one line; each failure one LaunchError line saying what was given, what failed, how long it took and the fix.

Name resolution and the connection are retried until `rdzv_timeout` (a Kubernetes pod's name resolves only once the
pod is up; machine 0 may boot later than the others), with one line saying so at the first failure. A refused
connection proves the address reachable: machine 0 answered, it only does not listen yet. Torch-free.

The waiting takes its clock, its pause and its connection attempt as keyword arguments (`clock`, `sleep`,
`connect`; by default `time.monotonic`, `time.sleep` and `socket.create_connection`), so that a test drives the
retries and the timeouts with a fake clock instead of real time.
"""

from __future__ import annotations

import errno
import socket
import sys
import time
from typing import Any, Callable, Mapping

from acc.contract.launch_plan import LaunchPlan
from acc.errors import LaunchError

ATTEMPT = 3.0  # seconds one connection attempt may take
PAUSE = 0.5  # seconds between two attempts

Clock = Callable[[], float]  # seconds, monotonic
Sleep = Callable[[float], None]
Connect = Callable[..., socket.socket]  # as socket.create_connection(address, timeout=...)


def needed(plan: LaunchPlan) -> bool:
    """Whether this plan meets other machines or processes at a known address (one machine alone does not)."""
    return plan.rendezvous is not None and bool(plan.rendezvous.endpoint) and (
        plan.num_machines > 1 or plan.engine == "task")


def hosts_store(plan: LaunchPlan) -> bool:
    """Whether this launcher's process will serve the rendezvous store (machine 0; with one task per process,
    rank 0)."""
    return plan.env.get("RANK") == "0" if plan.engine == "task" else plan.machine_rank == 0


def _whose(plan: LaunchPlan) -> str:
    if plan.engine == "task":
        return f"rank {plan.env.get('RANK')} of {plan.world_size}, on machine {plan.machine_rank}"
    return f"machine {plan.machine_rank} of {plan.num_machines}"


def _endpoint(plan: LaunchPlan) -> tuple[str, int]:
    assert plan.rendezvous is not None and plan.rendezvous.endpoint
    host, _, port = plan.rendezvous.endpoint.rpartition(":")
    return host.strip("[]"), int(port)


def _address_source(settings: Mapping[str, Any]) -> str:
    return settings.source("main_process_ip") if settings["main_process_ip"] else "default: one machine"


def planned(plan: LaunchPlan, settings: Mapping[str, Any], cluster: Any = None) -> str:
    """What `run` will check, in words (the dry run shows it)."""
    host, port = _endpoint(plan)
    where = (f"port {port} is free here ({_whose(plan)} hosts the store)" if hosts_store(plan)
             else f"{host}:{port} answers from here")
    count = f"; {plan.num_machines} machine(s), as {cluster.name} allocated" if cluster is not None else ""
    return (f"before the rendezvous: {host} ({_address_source(settings)}) resolves and {where}, within "
            f"{float(settings['rdzv_timeout']):g} s (--rdzv-timeout){count}")


def run(plan: LaunchPlan, settings: Mapping[str, Any], cluster: Any = None,
        say: Callable[[str], None] | None = None, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep,
        connect: Connect = socket.create_connection) -> str:
    """Run the checks; return the one line that reports them, or raise LaunchError (one line). `clock`, `sleep` and
    `connect` are the time and the connection attempt the retries use (a test passes fakes)."""
    say = say or (lambda line: print(f"acc launch: {line}", file=sys.stderr, flush=True))
    host, port = _endpoint(plan)
    timeout = float(settings["rdzv_timeout"])
    deadline = clock() + timeout
    source = _address_source(settings)
    whose = _whose(plan)
    address, took, waited = resolve(host, port, deadline, timeout, say, f"main address {host} (from {source})",
                                    whose, clock=clock, sleep=sleep)
    parts = [f"before the rendezvous ({whose}): main address {host} (from {source}) resolved to {address} in "
             f"{_ms(took)}" + (f", after {waited:.1f} s of retrying" if waited >= PAUSE else "")]
    if hosts_store(plan):
        parts.append(f"port {port} free here, where the store will be" if not getattr(cluster, "store_ready", False)
                     else f"port {port} is served by the launcher that started this process")
    else:
        took, answer, waited = reach(address, port, deadline, timeout, say, f"main address {host} (from {source}, "
                                     f"resolved to {address})", whose, clock=clock, sleep=sleep, connect=connect)
        parts.append(f"{address}:{port} {answer} in {_ms(took)}"
                     + (f", after {waited:.1f} s of retrying" if waited >= PAUSE else ""))
    if cluster is not None:
        parts.append(f"{plan.num_machines} machine(s), as {cluster.name} allocated "
                     f"({cluster.sources.get('num_machines', '?')})")
    return "; ".join(parts)


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms" if seconds < 1 else f"{seconds:.2f} s"


def resolve(host: str, port: int, deadline: float, timeout: float, say: Callable[[str], None], what: str,
            whose: str, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep) -> tuple[str, float, float]:
    """(the address `host` resolves to, seconds the successful look-up took, seconds spent retrying)."""
    start = clock()
    told = False
    while True:
        began = clock()
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            took = clock() - began
            infos.sort(key=lambda info: info[0] != socket.AF_INET)  # IPv4 first, as torch's store tries
            return infos[0][4][0], took, began - start
        except (socket.gaierror, UnicodeError) as exc:
            error = exc
        if clock() >= deadline:
            raise LaunchError(f"{what} does not resolve on this machine ({whose}): {_reason(error)}; tried for "
                              f"{clock() - start:.1f} s (--rdzv-timeout {timeout:g}). Check the name, or give "
                              "machine 0's address with --main-process-ip")
        if not told:
            say(f"{what} does not resolve yet ({_reason(error)}); retrying for up to {timeout:g} s (--rdzv-timeout)")
            told = True
        sleep(max(0.0, min(PAUSE, deadline - clock())))


def reach(address: str, port: int, deadline: float, timeout: float, say: Callable[[str], None], what: str,
          whose: str, *, clock: Clock = time.monotonic, sleep: Sleep = time.sleep,
          connect: Connect = socket.create_connection) -> tuple[float, str, float]:
    """(seconds the answering attempt took, what answered, seconds spent retrying). A refused connection counts:
    the machine answered, nothing listens on the port yet."""
    start = clock()
    told = False
    while True:
        began = clock()
        try:
            with connect((address, port), timeout=max(0.1, min(ATTEMPT, deadline - began))):
                return clock() - began, "answered (the store is up)", began - start
        except ConnectionRefusedError:
            return clock() - began, "answered (refused: nothing listens there yet)", began - start
        except OSError as exc:  # timed out, no route, network unreachable, ...
            error, attempt = exc, clock() - began
        if clock() >= deadline:
            raise LaunchError(f"{what} is not reachable from this machine ({whose}): port {port}: "
                              f"{_reason(error, attempt)}; "
                              f"tried for {clock() - start:.1f} s (--rdzv-timeout {timeout:g}). Check that "
                              f"machine 0 is up at that address and that no firewall blocks port {port} between the "
                              "machines")
        if not told:
            say(f"{what} does not answer yet on port {port} ({_reason(error, attempt)}); retrying for up to {timeout:g} s "
                "(--rdzv-timeout)")
            told = True
        sleep(max(0.0, min(PAUSE, deadline - clock())))


def _reason(exc: BaseException, attempt: float = 0.0) -> str:
    if isinstance(exc, socket.timeout):
        return f"no answer within {attempt:.1f} s (timed out)"
    if isinstance(exc, OSError) and exc.errno is not None and exc.strerror:
        name = errno.errorcode.get(exc.errno, "") if exc.errno > 0 else ""
        return f"{exc.strerror}" + (f" ({name})" if name else "")
    return str(exc) or type(exc).__name__
