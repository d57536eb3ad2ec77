"""The listening TCP sockets of a process and its descendants, read from /proc (what `ss -ltnp` shows), and network
namespaces to run launches in. The sockets are matched by inode: /proc/<pid>/fd names each socket's inode, and
/proc/<pid>/net/tcp{,6} (the table of that process's own network namespace) gives its address and state."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from acc.launcher import processes

LISTEN = "0A"


@dataclass(frozen=True)
class Listening:
    pid: int
    address: str
    port: int

    @property
    def loopback(self) -> bool:
        return ipaddress.ip_address(self.address).is_loopback

    @property
    def every_interface(self) -> bool:
        return ipaddress.ip_address(self.address).is_unspecified

    def __str__(self) -> str:
        return f"pid {self.pid} on {self.address}:{self.port}"


def descendants(root: int) -> list[int]:
    """`root` and every process below it (acc.launcher.processes)."""
    return [root, *processes.descendants(root, processes.children)]


def _table(pid: int) -> dict[int, tuple[str, int]]:
    """inode -> (address, port) of the listening sockets in the network namespace of `pid`."""
    found = {}
    for name, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/{pid}/net/{name}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != LISTEN:
                continue
            raw_address, raw_port = fields[1].split(":")
            raw = bytes.fromhex(raw_address)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # each 32-bit word is host order
            found[int(fields[9])] = (socket.inet_ntop(family, raw), int(raw_port, 16))
    return found


def listening_sockets(root: int) -> list[Listening]:
    """Every listening TCP socket held by `root` or a descendant (a socket inherited by fork counts once per
    holder)."""
    table = _table(root)
    out = set()
    for pid in descendants(root):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inode = int(target[8:-1])
                if inode in table:
                    out.add(Listening(pid, *table[inode]))
    return sorted(out, key=lambda s: (s.pid, s.port))


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True)


@contextmanager
def namespace_with_a_public_host_name() -> Iterator[tuple[list[str], str]]:
    """A network namespace with loopback and one other interface (one end of a veth pair, 10.78.n.1), in which this machine's
    host name resolves to that address (ip netns exec binds /etc/netns/<name>/hosts over /etc/hosts), as on a
    cluster machine: there gloo, left to itself, listens on the host name's address. Yields (the command prefix
    that runs a program in it, that address); raises OSError when namespaces are not available."""
    tag = uuid.uuid4().hex[:6]
    name = f"acc{tag}p"
    address = f"10.78.{10 + int(tag, 16) % 200}.1"
    etc = Path("/etc/netns") / name
    ends = (f"vp{tag}", f"vq{tag}")  # a veth pair, both ends inside the namespace (no dummy driver needed)
    steps = [("ip", "netns", "add", name), ("ip", "-n", name, "link", "set", "lo", "up"),
             ("ip", "link", "add", ends[0], "type", "veth", "peer", "name", ends[1]),
             ("ip", "link", "set", ends[0], "netns", name), ("ip", "link", "set", ends[1], "netns", name),
             ("ip", "-n", name, "addr", "add", f"{address}/24", "dev", ends[0]),
             ("ip", "-n", name, "link", "set", ends[0], "up"), ("ip", "-n", name, "link", "set", ends[1], "up")]
    made_parent = not etc.parent.exists()
    try:
        for step in steps:
            proc = _run(*step)
            if proc.returncode != 0:
                raise OSError(f"`{' '.join(step)}` failed: {proc.stderr.strip()}")
        etc.mkdir(parents=True, exist_ok=True)
        host = socket.gethostname()
        (etc / "hosts").write_text(f"127.0.0.1 localhost\n::1 localhost\n{address} {host}\n")
        yield ["ip", "netns", "exec", name], address
    finally:
        _run("ip", "netns", "del", name)  # removes the veth pair with it
        if (etc / "hosts").exists():
            (etc / "hosts").unlink()
        if etc.exists():
            etc.rmdir()
        if made_parent and etc.parent.exists() and not any(etc.parent.iterdir()):
            etc.parent.rmdir()


@contextmanager
def two_hosts_joined(subnet: str) -> Iterator[list[tuple[list[str], str, str]]]:
    """Two network namespaces joined by a veth pair (`subnet`.n.1 and .2, n random), as two machines on one network.
    Yields, for each, (the command prefix that runs a program in it, its address, its interface); raises OSError
    when namespaces are not available."""
    tag = uuid.uuid4().hex[:6]
    names = [f"acc{tag}h0", f"acc{tag}h1"]
    net = 10 + int(tag, 16) % 200
    addrs = [f"{subnet}.{net}.1", f"{subnet}.{net}.2"]
    links = [f"vh{tag}0", f"vh{tag}1"]
    steps = [("ip", "netns", "add", names[0]), ("ip", "netns", "add", names[1]),
             ("ip", "link", "add", links[0], "type", "veth", "peer", "name", links[1])]
    for i in (0, 1):
        steps += [("ip", "link", "set", links[i], "netns", names[i]),
                  ("ip", "-n", names[i], "addr", "add", f"{addrs[i]}/24", "dev", links[i]),
                  ("ip", "-n", names[i], "link", "set", links[i], "up"),
                  ("ip", "-n", names[i], "link", "set", "lo", "up")]
    try:
        for step in steps:
            proc = _run(*step)
            if proc.returncode != 0:
                raise OSError(f"`{' '.join(step)}` failed: {proc.stderr.strip()}")
        yield [(["ip", "netns", "exec", names[i]], addrs[i], links[i]) for i in (0, 1)]
    finally:
        for name in names:
            _run("ip", "netns", "del", name)
