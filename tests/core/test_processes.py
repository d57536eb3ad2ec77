"""acc.launcher.processes: a process's children, descendants and state, read from /proc, checked against real
processes this test starts (a sleeping child with a child of its own, a zombie, a reaped child)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

from acc.launcher import processes
from tests.waiting import read_until, wait_for_exit, wait_until


def test_children_descendants_and_state_of_real_processes():
    code = ("import subprocess, sys, time\n"
            "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
            "print(g.pid, flush=True)\ntime.sleep(60)\n")
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    grandchild = None
    try:
        line = read_until(child.stdout, "\n", timeout=30)
        grandchild = int(line)
        assert child.pid in processes.children(os.getpid())
        assert processes.children(child.pid) == [grandchild]
        below = processes.descendants(os.getpid(), processes.children)
        assert below.index(child.pid) < below.index(grandchild)  # parents first
        assert processes.state(os.getpid()) == "R"  # this process, reading its own state, is running
        assert wait_until(lambda: processes.state(grandchild) == "S", timeout=30), processes.state(grandchild)
        child.kill()
        assert wait_until(lambda: processes.state(child.pid) == "Z", timeout=30), processes.state(child.pid)
        assert child.pid in processes.children(os.getpid())  # a zombie is a child until it is reaped
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
        if grandchild is not None:
            os.kill(grandchild, signal.SIGKILL)
            assert wait_for_exit([grandchild], timeout=30) == []
    assert processes.state(child.pid) is None  # reaped: no such process
    assert child.pid not in processes.children(os.getpid())
