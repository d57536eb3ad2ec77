"""The suite's own bounded waits (tests/waiting.py): each returns when its event happens, at once, and says so;
a process that ends first or the timeout end it, saying so too."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from tests import waiting

LONG = 60  # seconds: the timeout of a wait that its event must end first
QUICK = 10  # seconds: within it an event ends the wait, even on a loaded machine (no bound is tighter)


def later(seconds, action):
    timer = threading.Timer(seconds, action)
    timer.start()
    return timer


def test_a_path_that_appears_later_in_a_directory_not_made_yet_ends_the_wait_at_once(tmp_path):
    target = tmp_path / "a" / "b" / "done"

    def make():
        target.parent.mkdir(parents=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text("x")
        os.replace(tmp, target)  # as the workers' dump: a rename into place

    started = time.monotonic()
    later(0.2, make)
    assert waiting.wait_for_paths([target, tmp_path / "a"], timeout=LONG)
    assert time.monotonic() - started < QUICK
    assert waiting.wait_for_paths([target], timeout=0)  # already there: no wait at all


def test_a_path_that_never_appears_is_the_timeout_or_the_end_of_the_process_that_would_make_it(tmp_path):
    started = time.monotonic()
    assert not waiting.wait_for_paths([tmp_path / "never"], timeout=0.3)
    assert 0.3 <= time.monotonic() - started < QUICK  # not before its timeout
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = time.monotonic()
    assert not waiting.wait_for_paths([tmp_path / "never"], timeout=LONG, ended=[proc])
    assert time.monotonic() - started < QUICK
    proc.wait()
    assert not waiting.wait_for_paths([tmp_path / "never"], timeout=LONG, ended=[proc])  # ended before: at once
    # what the process made just before it ended counts
    made = tmp_path / "made"
    proc = subprocess.Popen([sys.executable, "-c", f"open({str(made)!r}, 'w').close()"])
    assert waiting.wait_for_paths([made], timeout=LONG, ended=[proc])
    proc.wait()


def test_wait_until_rechecks_at_each_change_of_a_file_in_the_directory(tmp_path):
    log = tmp_path / "events"
    log.write_text("")

    def append(n):
        with log.open("a") as fp:
            fp.write("x" * n)

    for n, delay in ((1, 0.1), (2, 0.2), (3, 0.3)):
        later(delay, lambda n=n: append(n))
    started = time.monotonic()
    assert waiting.wait_until(lambda: len(log.read_text()) == 6, timeout=LONG, changes_in=[tmp_path])
    assert time.monotonic() - started < QUICK


def test_a_descriptor_that_becomes_readable_ends_the_wait(tmp_path):
    r, w = os.pipe()
    with open(r, "rb", buffering=0) as stop:
        later(0.1, lambda: os.write(w, b"."))
        started = time.monotonic()
        assert not waiting.wait_for_paths([tmp_path / "never"], timeout=LONG, ended=[stop])
        assert time.monotonic() - started < QUICK
    os.close(w)


def test_wait_for_exit_returns_when_the_processes_end_and_names_those_still_running():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    slow = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        assert waiting.wait_for_exit([quick.pid], timeout=LONG) == []  # not reaped yet: a zombie has ended
        assert time.monotonic() - started < QUICK
        assert waiting.wait_for_exit([quick.pid, slow.pid], timeout=0.2) == [slow.pid]
        quick.wait()
        assert waiting.wait_for_exit([quick.pid], timeout=LONG) == []  # reaped: gone
    finally:
        slow.kill()
        slow.wait()


def test_read_until_stops_at_the_text_and_communicate_reads_the_rest():
    code = ("import sys, time\nprint('one', file=sys.stderr, flush=True)\ntime.sleep(0.2)\n"
            "print('two', file=sys.stderr, flush=True)\ninput()\nprint('three', file=sys.stderr)\n")
    proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    seen = waiting.read_until(proc.stderr, "two", timeout=LONG)
    # it stops once "two" arrived; the line's end may come in a write of its own (an unbuffered stderr), later
    assert seen in ("one\ntwo", "one\ntwo\n"), seen
    later = waiting.read_until(proc.stderr, "three", timeout=0.2)  # the child waits for its input: the timeout
    assert later in ("", "\n") and len(seen + later) == len("one\ntwo\n"), (seen, later)
    _, rest = proc.communicate("\n", timeout=LONG)
    assert seen + later + rest == "one\ntwo\nthree\n"
    proc = subprocess.Popen([sys.executable, "-c", "print('no')"], stdout=subprocess.PIPE, text=True)
    started = time.monotonic()
    assert waiting.read_until(proc.stdout, "yes", timeout=LONG) == "no\n"  # the pipe ended first
    assert time.monotonic() - started < QUICK
    proc.communicate(timeout=LONG)


def test_without_inotify_or_pidfd_the_waits_poll_and_say_the_same(tmp_path, monkeypatch):
    monkeypatch.setattr(waiting, "_libc", False)
    monkeypatch.delattr(os, "pidfd_open")
    target = tmp_path / "late" / "done"
    later(0.2, lambda: (target.parent.mkdir(), target.touch()))
    assert waiting.wait_for_paths([target], timeout=LONG)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.2)"])
    started = time.monotonic()
    assert not waiting.wait_for_paths([tmp_path / "never"], timeout=LONG, ended=[proc.pid])
    assert waiting.wait_for_exit([proc.pid], timeout=LONG) == [] and time.monotonic() - started < QUICK
    proc.wait()


def test_wait_for_text_waits_past_an_empty_file_for_what_its_writer_writes(tmp_path):
    from tests.waiting import is_json, is_pid, wait_for_text

    pid, record = tmp_path / "pid0", tmp_path / "rank0.json"
    pid.touch()  # created, nothing written yet: what a reader that waited for the path alone would read
    record.write_text('{"step": ')  # half a JSON document

    def writer():
        time.sleep(0.2)
        pid.write_text("1234\n")
        record.write_text('{"step": 3}')

    thread = threading.Thread(target=writer)
    thread.start()
    assert not wait_for_text([pid], 0.05, complete=is_pid)  # still empty
    assert wait_for_text([pid], 10, complete=is_pid) and wait_for_text([record], 10, complete=is_json)
    thread.join()
    assert pid.read_text().strip() == "1234"
