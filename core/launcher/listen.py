"""Where a launch listens: the rendezvous store on loopback on one machine, on one chosen address across machines.

torch's `TCPStore` server listens on every interface (`*:PORT`) whatever host it is given, and the store is
unauthenticated: anyone who reaches it can write keys into a running job. So acc binds the listening socket itself
and hands it to the store (`TCPStore(master_listen_fd=...)`); torch's rendezvous then shares that store (it opens
its own with `multi_tenant=True` on the same port, which reuses the server this process already runs).

- **One machine**: the launcher's store listens on 127.0.0.1 (a free port, held from the bind on: no race); the
  agent and the workers meet there through the static rendezvous (one machine needs nothing of c10d's), so no
  second store is opened. The workers' process group is bound to the loopback interface too
  (GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME, unless set): nothing of the run is reachable from another host.
- **Across machines**: machine 0's store listens on the address of machine 0 that reaches --main-process-ip (its
  own address when that is one of machine 0's), or on `--listen-address`; never on every interface unless asked
  (`--listen-address 0.0.0.0`, `::` or `*`). gloo uses the interface of that address on each machine unless
  GLOO_SOCKET_IFNAME is set. With `--rdzv-backend c10d`, torch (2.13) also opens a store for the workers on every
  interface of the machine that gets group rank 0, which nothing outside torch can bind: the default static
  rendezvous opens none.

Torch-free until a store is opened.
"""

from __future__ import annotations

import errno
import os
import socket
import sys
from dataclasses import replace
from typing import Any, Mapping

from acc.contract.launch_plan import LaunchPlan
from acc.errors import LaunchError

LOOPBACK = "127.0.0.1"
EVERY_INTERFACE = ("0.0.0.0", "::", "*")
IFF_LOOPBACK = 0x8


# ------------------------------------------------------------------ addresses and interfaces


def loopback_interface() -> str:
    """The name of the loopback interface (`lo` on Linux, `lo0` on macOS)."""
    base = "/sys/class/net"
    try:
        for name in sorted(os.listdir(base)):
            try:
                with open(os.path.join(base, name, "flags")) as fp:
                    if int(fp.read().strip(), 16) & IFF_LOOPBACK:
                        return name
            except (OSError, ValueError):
                continue
    except OSError:
        pass
    return "lo0" if sys.platform == "darwin" else "lo"


def is_loopback(address: str) -> bool:
    import ipaddress

    try:
        return ipaddress.ip_address(address.strip("[]").split("%")[0]).is_loopback
    except ValueError:
        return address == "localhost"


def route_source(host: str) -> str | None:
    """The address of this machine that the kernel would send from to reach `host` (no packet is sent: a UDP
    socket's connect only chooses the route); None when `host` does not resolve or no route leads there."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except (socket.gaierror, UnicodeError, OSError):
        return None
    for family, kind, proto, _, address in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.connect(address)
                return str(sock.getsockname()[0]).split("%")[0]
        except OSError:
            continue
    return None


def numeric(address: str) -> str | None:
    """`address` as an IP address (a host name resolved here), else None."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(address.strip("[]").split("%")[0]))
    except ValueError:
        pass
    try:
        return str(socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)[0][4][0]).split("%")[0]
    except (socket.gaierror, UnicodeError, OSError, IndexError):
        return None


def interface_of(address: str) -> str | None:
    """The name of the interface that holds `address` (an IP address or a host name) on this machine (Linux),
    else None."""
    resolved = numeric(address)
    if resolved is None:
        return None
    address = resolved
    if is_loopback(address):
        return loopback_interface()
    if ":" in address:
        return _ipv6_interface(address)
    if not sys.platform.startswith("linux"):
        return None
    import fcntl
    import struct

    siocgifaddr = 0x8915
    for _, name in socket.if_nameindex():
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                answer = fcntl.ioctl(sock.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
        if socket.inet_ntoa(answer[20:24]) == address:
            return name
    return None


def _ipv6_interface(address: str) -> str | None:
    try:
        wanted = socket.inet_pton(socket.AF_INET6, address.split("%")[0]).hex()
        with open("/proc/net/if_inet6") as fp:
            for line in fp:
                fields = line.split()
                if len(fields) >= 6 and fields[0] == wanted:
                    return fields[5]
    except (OSError, ValueError):
        pass
    return None


def local_addresses() -> list[str]:
    """This machine's IPv4 addresses (for messages), loopback first."""
    found = [LOOPBACK]
    if sys.platform.startswith("linux"):
        import fcntl
        import struct

        for _, name in socket.if_nameindex():
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                try:
                    answer = fcntl.ioctl(sock.fileno(), 0x8915, struct.pack("256s", name.encode()[:15]))
                except OSError:
                    continue
            address = socket.inet_ntoa(answer[20:24])
            if address not in found:
                found.append(address)
    return found


# ------------------------------------------------------------------ the plan's choice


def choose(settings: Mapping[str, Any]) -> tuple[str | None, str]:
    """(the address machine 0's store listens on, why), from the settings; the address is None when it cannot be
    known yet (the main address does not resolve here): the launch then fails naming it."""
    given = settings.get("listen_address")
    source = settings.source("listen_address") if hasattr(settings, "source") else "setting listen_address"
    if given:
        address = every_interface() if given == "*" else given
        if address in EVERY_INTERFACE:
            return address, f"every interface, as asked ({source})"
        return address, f"as asked ({source})"
    if settings["num_machines"] == 1:
        return LOOPBACK, "one machine: nothing of the run is reachable from another host (--listen-address to change)"
    return main_machine_address(settings["main_process_ip"] or "")


def main_machine_address(ip: str) -> tuple[str | None, str]:
    """(the address machine 0's store listens on across machines, why): `ip` itself when it is one of this
    machine's, else this machine's address that reaches it; None when `ip` does not resolve (yet) or no route leads
    there (machine 0 asks again after the checks before the rendezvous, which wait for the name to resolve)."""
    found = route_source(ip) if ip else None
    if found is None:
        return None, f"the address of machine 0 that reaches --main-process-ip {ip} (none found: it does not resolve " \
                     "or no route leads there from here)"
    hint = ""
    if is_loopback(found) and not is_loopback(ip):
        hint = (f"; {ip} resolves to {found} here, a loopback address: only launchers on this machine can join (give "
                "--listen-address with the address the other machines reach)")
    if found == ip or is_local(ip):
        return ip, f"--main-process-ip {ip}, an address of machine 0{hint} (--listen-address to change)"
    return found, (f"machine 0's address that reaches --main-process-ip {ip}, which is not one of this machine's: "
                   f"the other machines must reach it through a NAT or forwarder{hint} (--listen-address to change)")


def every_interface() -> str:
    """The address that listens on every interface: `::` (IPv6 and IPv4) where IPv6 works, else 0.0.0.0."""
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
        return "::"
    except OSError:
        return "0.0.0.0"


def is_local(address: str) -> bool:
    """Whether `address` is one of this machine's (a socket can be bound to it)."""
    try:
        infos = socket.getaddrinfo(address, 0, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError, OSError):
        return False
    for family, kind, proto, _, sockaddr in infos:
        try:
            with socket.socket(family, kind, proto) as sock:
                sock.bind(sockaddr)
                return True
        except OSError:
            continue
    return False


def connect_host(listen: str) -> str:
    """The address this machine's agent and workers connect to, for a store listening on `listen`."""
    if listen in ("0.0.0.0", "*"):
        return LOOPBACK
    if listen == "::":
        return "::1"
    return listen


def worker_environment(settings: Mapping[str, Any], listen: str | None, environ: Mapping[str, str]) -> dict[str, str]:
    """The variables that bind the workers' process group where the store listens (a variable already set wins):
    one machine, the loopback interface for gloo and NCCL; across machines, gloo on the interface of the address
    that reaches machine 0 (NCCL keeps choosing its own: InfiniBand, ...)."""
    out: dict[str, str] = {}
    if settings["num_machines"] == 1:
        if listen is not None and listen not in EVERY_INTERFACE and not is_loopback(listen):
            interface = interface_of(listen)
        elif listen in EVERY_INTERFACE:
            interface = None  # asked for every interface: torch chooses as it would
        else:
            interface = loopback_interface()
        if interface:
            out = {"GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}
    else:
        source = listen if settings["machine_rank"] == 0 and listen not in EVERY_INTERFACE else \
            route_source(settings["main_process_ip"] or "")
        interface = interface_of(source) if source else None
        if interface:
            out = {"GLOO_SOCKET_IFNAME": interface}
    return {k: v for k, v in out.items() if k not in environ}


# ------------------------------------------------------------------ binding


def bind(address: str, port: int, why: str = "") -> socket.socket:
    """A listening TCP socket on address:port (port 0: a free one), or a LaunchError saying what was given, what
    failed and the fix."""
    host = every_interface() if address == "*" else address
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except (socket.gaierror, UnicodeError) as exc:
        raise LaunchError(f"the rendezvous store cannot listen on {address!r}{_why(why)}: it does not resolve "
                          f"({exc}); give --listen-address with an address of this machine (one of "
                          f"{', '.join(local_addresses())}), or 0.0.0.0 for every interface") from None
    family, kind, proto, _, sockaddr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's store: a run right after another
        if family == socket.AF_INET6 and host == "::":
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # every interface means IPv4 too
        sock.bind(sockaddr)
        sock.listen(2048)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise LaunchError(f"port {port} is already in use on {address} (this machine); choose a free "
                              "--main-process-port, or on one machine leave it out and a free port is picked") from None
        if exc.errno == errno.EADDRNOTAVAIL:
            raise LaunchError(f"the rendezvous store cannot listen on {address}{_why(why)}: it is not an address of "
                              f"this machine (its addresses: {', '.join(local_addresses())}); give --listen-address "
                              "ADDRESS (an address of this machine the other machines reach), or 0.0.0.0 for every "
                              "interface") from None
        raise LaunchError(f"the rendezvous store cannot listen on {address}:{port}{_why(why)}: {exc.strerror}") \
            from None
    return sock


def _why(why: str) -> str:
    return f" ({why})" if why else ""


def open_store(listen: str, port: int, host: str, timeout: float, why: str = "") -> tuple[Any, int]:
    """(a master TCPStore listening on listen:port only, its port). `host` is the address clients use (torch's
    rendezvous opens its own handle on the same port and shares this server)."""
    from datetime import timedelta

    from torch.distributed import TCPStore

    sock = bind(listen, port, why)
    chosen = sock.getsockname()[1]
    try:
        store = TCPStore(host, chosen, is_master=True, wait_for_workers=False, multi_tenant=True,
                         timeout=timedelta(seconds=max(float(timeout), 1.0)), master_listen_fd=sock.fileno())
    except BaseException:
        sock.close()
        raise
    sock.detach()  # the store owns the descriptor now (it closes it when it ends)
    return store, chosen


def serve_one_machine(plan: LaunchPlan) -> tuple[LaunchPlan, Any]:
    """Open this one-machine launch's store where the plan says (loopback unless asked) and return the plan with
    the endpoint that names its port, and the store (keep it referenced until the workers ended)."""
    rdzv = plan.rendezvous
    assert rdzv is not None and rdzv.endpoint
    host, _, port = rdzv.endpoint.rpartition(":")
    listen = rdzv.listen or LOOPBACK
    store, chosen = open_store(listen, int(port or 0), host.strip("[]"), rdzv.timeout)
    return replace(plan, rendezvous=replace(rdzv, endpoint=host_port(host.strip("[]"), str(chosen)))), store


# ------------------------------------------------------------------ in words


def describe(plan: LaunchPlan, env: Mapping[str, str] | None = None, started: bool = False) -> str:
    """What listens where, in words (the dry run's `listening` row; at start, `started`, with the port)."""
    rdzv = plan.rendezvous
    if rdzv is None:
        return "nothing (one plain process)"
    env = os.environ if env is None else env
    gloo = plan.env.get("GLOO_SOCKET_IFNAME") or env.get("GLOO_SOCKET_IFNAME")
    _, _, port = (rdzv.endpoint or "").rpartition(":")
    free = not started and port in ("", "0")
    if gloo:
        names = "GLOO_SOCKET_IFNAME" + (", NCCL_SOCKET_IFNAME" if "NCCL_SOCKET_IFNAME" in plan.env else "")
        group = f"the workers' process group on interface {gloo} ({names}" + \
            (")" if "GLOO_SOCKET_IFNAME" in plan.env else ", set by you)")
    else:
        group = "the workers' process group where torch chooses (from the host name; GLOO_SOCKET_IFNAME chooses)"
    if plan.engine == "task":  # the scheduler started every process: torch's init_process_group opens the store
        if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
            store = f"no store here (the launcher that started this process serves it at {rdzv.endpoint})"
        elif plan.env.get("RANK") == "0":
            store = (f"torch's store, opened by init_process_group in this process (rank 0) on every interface, port "
                     f"{port} (one task per process: acc does not open it, so cannot bind it)")
        else:
            store = f"no store here (rank 0 hosts it at {rdzv.endpoint})"
        return f"{store}, {group}"
    if plan.num_machines == 1:
        listen = rdzv.listen or LOOPBACK
        where = "loopback only" if is_loopback(listen) else ("every interface" if listen in EVERY_INTERFACE else
                                                              f"{listen} only")
        store = f"the rendezvous store on {host_port(listen, 'PORT' if free else port)}" + \
            (" (a free port, picked at start)" if free else "")
        tail = "" if started else f"; {rdzv.listen_why}"
        return f"{where}: {store}, {group}{tail}"
    if plan.machine_rank == 0:
        store = (f"the rendezvous store on {host_port(rdzv.listen, port)} only ({rdzv.listen_why})" if rdzv.listen else
                 f"the rendezvous store: {rdzv.listen_why}")
    else:
        store = f"no store here (machine 0 hosts it at {rdzv.endpoint})"
    caveat = ("; with the c10d rendezvous torch also opens a store for the workers on every interface of the "
              "machine that gets group rank 0 (the default static rendezvous does not)") if rdzv.backend == "c10d" \
        else ""
    return f"{store}, {group}{caveat}"


def host_port(address: str, port: str) -> str:
    """address:port, an IPv6 address in brackets (as torch's rendezvous endpoints take them)."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"


__all__ = ["bind", "choose", "connect_host", "describe", "every_interface", "host_port", "interface_of",
           "loopback_interface", "main_machine_address", "numeric", "open_store", "route_source", "serve_one_machine",
           "worker_environment"]
