"""The machines of a multi-machine launch: a roll call before the elastic agent starts, heartbeats while it runs.

Machine 0's launcher hosts a TCPStore at main_process_ip:main_process_port, listening only on the address chosen by
listen.py (the one the agent's rendezvous then shares: torch's static and c10d rendezvous open their store there
with `multi_tenant=True`); every launcher
writes its machine rank, host and process id under `acc-launch/`.

- **Roll call**: each launcher waits up to `rdzv_timeout` seconds for every machine. On time-out the launch fails
  (exit code 1) naming the machines that joined and those missing, with the flag that gives them longer.
- **Main process**: with the static rendezvous (the default across machines) machine k hosts global ranks
  k*n..k*n+n-1. With c10d the ranks follow c10d's order (host name, then the launcher's process id), which the
  roll call knows, so each launcher says which machine holds the main process.
- **Heartbeats**: every launcher adds 1 to its counter every HEARTBEAT seconds. A machine whose counter has not
  moved for LOST_AFTER seconds (and that did not say it ended), or, seen from the other machines, a machine 0 whose
  store stopped answering for as long, is lost: the other launchers stop their workers (SIGTERM to themselves,
  which the agent turns into stopping every worker) and report which machine was lost. A launcher whose workers
  failed first waits up to LOST_AFTER seconds to tell whether a lost machine caused it. Machine 0, which hosts
  the store, leaves last (once the others said they ended, or went silent).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from datetime import timedelta
from typing import Any

from acc.contract.launch_plan import LaunchPlan
from acc.launcher.processes import children, descendants

PREFIX = "acc-launch/"
HEARTBEAT = 0.5  # seconds between two heartbeats of a launcher
LOST_AFTER = 5.0  # seconds without a heartbeat after which a machine is lost
OP_TIMEOUT = 2.0  # seconds one store operation may take once connected
STOP_GRACE = 5.0  # seconds the agent has to stop the workers after a loss before the launcher stops them itself


class RendezvousTimeout(Exception):
    """Not every machine joined within rdzv_timeout (the message names them and the fix)."""


def _command_hint(timeout: float) -> str:
    return f"add --rdzv-timeout {int(max(timeout * 2, 1800))} to the acc launch command of every machine"


class Machines:
    def __init__(self, plan: LaunchPlan):
        assert plan.rendezvous is not None and plan.rendezvous.endpoint
        self.plan = plan
        self.rank = plan.machine_rank
        self.count = plan.num_machines
        host, _, port = plan.rendezvous.endpoint.rpartition(":")
        self.host, self.port = host, int(port)
        self.timeout = float(plan.rendezvous.timeout)
        self.store: Any = None
        self.roll: dict[int, dict] = {}
        self.lost: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._running = False
        self._seen: dict[int, tuple[int, float]] = {}  # machine -> (counter, when it last moved)
        self._unreachable_since: float | None = None
        self._lock = threading.Lock()

    # ------------------------------------------------------------------ roll call
    def join(self) -> None:
        from torch.distributed import TCPStore

        deadline = time.monotonic() + self.timeout
        me = {"host": socket.gethostname(), "fqdn": socket.getfqdn(), "pid": os.getpid(),
              "nproc": self.plan.nproc_per_machine}
        if self.rank == 0:  # listening on the chosen address only, never every interface unless asked (listen.py)
            from dataclasses import replace

            from acc.errors import LaunchError
            from acc.launcher.listen import main_machine_address, open_store

            rdzv = self.plan.rendezvous
            if not rdzv.listen:  # the main address did not resolve when the plan was made: the checks waited for it
                address, why = main_machine_address(self.host)
                rdzv = replace(rdzv, listen=address, listen_why=why)
                self.plan = replace(self.plan, rendezvous=rdzv)
            if not rdzv.listen:
                raise LaunchError(f"machine 0 cannot tell where its rendezvous store should listen: {rdzv.listen_why}; "
                                  "check --main-process-ip, or give --listen-address ADDRESS (an address of this "
                                  "machine the other machines reach)")
            self.store, _ = open_store(rdzv.listen, self.port, self.host, self.timeout, rdzv.listen_why)
        else:
            self._wait_for_port(deadline)
            self.store = TCPStore(self.host, self.port, is_master=False,
                                  timeout=timedelta(seconds=max(1.0, deadline - time.monotonic())))
        self.store.set_timeout(timedelta(seconds=OP_TIMEOUT))
        self.store.set(f"{PREFIX}machine/{self.rank}", json.dumps(me))
        keys = [f"{PREFIX}machine/{k}" for k in range(self.count)]
        try:
            self._roll_call(keys, deadline)
        except RendezvousTimeout:
            raise
        except Exception as exc:  # noqa: BLE001  (the store went away: machine 0 stopped during the roll call)
            raise RendezvousTimeout(f"machine 0's rendezvous store at {self.host}:{self.port} stopped answering "
                                    f"while the machines joined ({type(exc).__name__}); this is machine {self.rank} "
                                    f"of {self.count}. Start every machine's acc launch again") from None

    def _roll_call(self, keys: list[str], deadline: float) -> None:
        while True:
            if self.rank != 0 and self.store.check([f"{PREFIX}abort"]):
                raise RendezvousTimeout(self.store.get(f"{PREFIX}abort").decode())
            if self.store.check(keys) and (self.rank == 0 or self.store.check([f"{PREFIX}go"])):
                break
            if time.monotonic() > deadline:
                message = self._missing_message()
                if self.rank == 0:
                    self.store.set(f"{PREFIX}abort", message)
                    if sum(self.store.check([k]) for k in keys) > 1:
                        time.sleep(4 * HEARTBEAT)  # let the machines that joined read why before the store goes
                raise RendezvousTimeout(message)
            time.sleep(0.05)
        self.roll = {k: json.loads(v) for k, v in zip(range(self.count), self.store.multi_get(keys))}
        sizes = {k: info["nproc"] for k, info in self.roll.items()}
        if len(set(sizes.values())) > 1:
            raise RendezvousTimeout("the machines start different numbers of processes ("
                                    + ", ".join(f"machine {k}: --nproc {n}" for k, n in sorted(sizes.items()))
                                    + "); give every machine the same --nproc")
        if self.rank == 0:
            self.store.set(f"{PREFIX}go", "1")

    def _wait_for_port(self, deadline: float) -> None:
        """Wait (quietly) until machine 0's store accepts connections, or fail when the time is up."""
        while True:
            try:
                with socket.create_connection((self.host, self.port), timeout=1.0):
                    return
            except OSError:
                if time.monotonic() > deadline:
                    raise RendezvousTimeout(
                        f"machine 0 (the main machine, expected at {self.host}:{self.port}) did not answer within "
                        f"{self.timeout:g} s (--rdzv-timeout); this is machine {self.rank} of {self.count}. Start "
                        f"`acc launch ... --machine-rank 0` there, check --main-process-ip/--main-process-port, or "
                        f"give it longer: {_command_hint(self.timeout)}") from None
                time.sleep(0.2)

    def _missing_message(self) -> str:
        joined, missing = [], []
        for k in range(self.count):
            key = f"{PREFIX}machine/{k}"
            if self.store.check([key]):
                info = json.loads(self.store.get(key))
                joined.append(f"machine {k} ({info['host']}, launcher pid {info['pid']})")
            else:
                missing.append(str(k))
        return (f"machine(s) {', '.join(missing)} of {self.count} did not join the rendezvous at {self.host}:"
                f"{self.port} within {self.timeout:g} s (--rdzv-timeout); joined: {', '.join(joined)}. Start "
                f"`acc launch ... --machine-rank {missing[0]}` on the missing machine(s) with the same "
                f"--main-process-ip/--main-process-port, or give them longer: {_command_hint(self.timeout)}")

    def main_machine(self) -> tuple[int, str]:
        """(the machine that holds global rank 0, why)."""
        rdzv = self.plan.rendezvous
        if rdzv.backend == "static":
            return 0, "the static rendezvous gives machine k the global ranks k*nproc.."
        if rdzv.backend == "c10d":
            order = sorted(self.roll, key=lambda k: (self.roll[k]["fqdn"], self.roll[k]["pid"]))
            return order[0], ("the c10d rendezvous orders machines by host name, then launcher pid "
                              "(--rdzv-backend static keeps it on machine 0)")
        return -1, f"the {rdzv.backend} rendezvous decides"

    def describe(self) -> str:
        n = self.plan.nproc_per_machine
        main, why = self.main_machine()
        me = f"machine {self.rank} of {self.count} ({self.roll[self.rank]['host']})"
        if main < 0:
            return f"{me}: every machine joined; the main process's machine is decided by the rendezvous ({why})"
        if self.plan.rendezvous.backend == "static":
            ranks = f"global ranks {self.rank * n}..{self.rank * n + n - 1}"
        else:
            order = sorted(self.roll, key=lambda k: (self.roll[k]["fqdn"], self.roll[k]["pid"]))
            position = order.index(self.rank)
            ranks = f"global ranks {position * n}..{position * n + n - 1}"
        host = self.roll[main]["host"]
        return f"{me}: {ranks}; the main process (rank 0) runs on machine {main} ({host}): {why}"

    # ------------------------------------------------------------------ heartbeats
    def watch(self) -> None:
        from torch.distributed.elastic.multiprocessing import SignalException

        def stop(signum: int, frame: Any) -> None:  # as the agent's own handler (installed once workers start)
            raise SignalException(f"Process {os.getpid()} got signal: {signum}", sigval=signal.Signals(signum))

        signal.signal(signal.SIGTERM, stop)
        self._running = True
        now = time.monotonic()
        self._seen = {k: (-1, now) for k in range(self.count) if k != self.rank}
        self._thread = threading.Thread(target=self._beat, name="acc-machines", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT):
            found = self._check()
            if found and self._running and not self._stop.is_set():
                with self._lock:
                    if self.lost is None:
                        self.lost = found
                os.kill(os.getpid(), signal.SIGTERM)  # the agent stops every worker, then execute() reports
                if not self._stop.wait(STOP_GRACE):  # the main thread is stuck in C++ (e.g. a store connect)
                    self._stop_now()
                return

    def _stop_now(self) -> None:
        """Report, stop every process this launcher started (SIGTERM, then SIGKILL) and exit 1."""
        import sys


        print(f"acc launch: {self.lost}; the workers on this machine were stopped", file=sys.stderr, flush=True)
        pending = descendants(os.getpid(), children)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in pending:
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            end = time.monotonic() + 3
            while pending and time.monotonic() < end:
                pending = [p for p in pending if _alive(p)]
                time.sleep(0.05)
        os._exit(1)

    def _check(self) -> str | None:
        """One heartbeat: add to ours, look at the others'; the lost machine, in words, or None."""
        now = time.monotonic()
        if self._unreachable_since is not None:  # a TCPStore client does not reconnect: no more store calls
            return self._unreachable(now)
        try:
            self.store.add(f"{PREFIX}beat/{self.rank}", 1)
            for k in list(self._seen):
                if self.store.check([f"{PREFIX}done/{k}"]):
                    del self._seen[k]  # it ended and said so
                    continue
                value = self.store.add(f"{PREFIX}beat/{k}", 0)
                counter, since = self._seen[k]
                if value != counter:
                    self._seen[k] = (value, now)
                elif now - since > LOST_AFTER:
                    info = self.roll.get(k, {})
                    return (f"machine {k} ({info.get('host', '?')}, launcher pid {info.get('pid', '?')}) was lost: "
                            f"its launcher sent no heartbeat for {now - since:.1f} s (killed, crashed or cut off)")
            self._unreachable_since = None
        except Exception:  # noqa: BLE001  (the store is gone or stuck: machine 0 is lost, or we are)
            self._unreachable_since = now
        return None

    def _unreachable(self, now: float) -> str | None:
        if self.rank == 0 or now - self._unreachable_since <= LOST_AFTER:
            return None
        info = self.roll.get(0, {})
        return (f"machine 0 ({info.get('host', '?')}, launcher pid {info.get('pid', '?')}) was lost: its "
                f"rendezvous store at {self.host}:{self.port} stopped answering {now - self._unreachable_since:.1f} s "
                "ago (killed, crashed or cut off)")

    def verdict(self) -> str | None:
        """After the local workers failed: the lost machine that explains it, if any (waits at most LOST_AFTER s for
        the others' next heartbeats)."""
        self._running = False  # the watcher thread must not signal any more: the agent already stopped
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * OP_TIMEOUT)
        if self.lost:
            return self.lost
        start = time.monotonic()
        before = dict(self._seen)
        while time.monotonic() - start < LOST_AFTER + 2 * HEARTBEAT:
            if self.lost:
                return self.lost
            found = self._check()
            if found:
                return found
            moved = all(self._seen.get(k, (None,))[0] != before[k][0] for k in before)
            if moved and self._unreachable_since is None:
                return None  # every other launcher is alive
            time.sleep(HEARTBEAT / 2)
        return None

    def done(self, code: int) -> None:
        """Tell the other machines this launcher is ending (not lost)."""
        self._running = False
        try:
            self.store.set(f"{PREFIX}done/{self.rank}", str(code))
        except Exception:  # noqa: BLE001
            pass

    def close(self) -> None:
        self._running = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2 * OP_TIMEOUT)
        if self.rank == 0 and self.store is not None:
            self._linger()

    def _linger(self) -> None:
        """Machine 0 hosts the store: it leaves last, once every other launcher said it ended (or is silent), so
        that none of them takes machine 0's departure for a loss."""
        deadline = time.monotonic() + LOST_AFTER + 1
        beats: dict[int, tuple[int, float]] = {}
        try:
            while time.monotonic() < deadline:
                pending = [k for k in range(1, self.count) if not self.store.check([f"{PREFIX}done/{k}"])]
                now = time.monotonic()
                for k in pending:
                    value = self.store.add(f"{PREFIX}beat/{k}", 0)
                    if k not in beats or beats[k][0] != value:
                        beats[k] = (value, now)
                alive = [k for k in pending if now - beats[k][1] < 3 * HEARTBEAT]
                if not alive:
                    return
                time.sleep(HEARTBEAT / 2)
        except Exception:  # noqa: BLE001
            return


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status") as fp:
            return "zombie" not in fp.read().lower()
    except OSError:
        return False


