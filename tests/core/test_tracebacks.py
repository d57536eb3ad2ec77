"""Readable failures (acc.runtime.tracebacks): pluggy's frames, acc's dispatch and hook implementations are left out of the
tracebacks acc prints and records; the user's frames and the frame that raised stay; ACC_DEBUG=1 shows them all."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pluggy
import pytest

import acc
from acc import hookimpl
from acc.runtime.tracebacks import format_exception
from tests.conftest import clean_env

PLUGGY = str(__import__("pathlib").Path(pluggy.__file__).parent) + "/"
ACC_DIR = str(__import__("pathlib").Path(acc.__file__).parent) + "/"


def _raise_through_a_hook():
    """A user-level function that calls a hook (a wrapper around an implementation that raises in a library)."""
    import json

    import acc.builtin.cpu
    from acc.assembly.plugins import new_plugin_manager, register

    class Wrapper:
        ACC_HOOKSPEC_VERSION = 2

        @hookimpl(wrapper=True)
        def acc_backward(self, ctx, loss, kwargs):
            return (yield)

    pm = new_plugin_manager()
    register(pm, acc.builtin.cpu, "cpu")
    pm.register(Wrapper(), name="wrapper")

    class Loss:
        def backward(self, **kwargs):
            json.loads("{not json")  # raises inside a library (json), called from the backend

    pm.hook.acc_backward(ctx=None, loss=Loss(), kwargs={})


def test_hook_frames_are_hidden_the_user_and_the_raising_frames_kept(monkeypatch):
    monkeypatch.delenv("ACC_DEBUG", raising=False)
    with pytest.raises(ValueError) as info:
        _raise_through_a_hook()
    full = "".join(__import__("traceback").format_exception(info.value))
    assert PLUGGY in full and ACC_DIR in full and "in acc_backward" in full  # the control: they were there
    text = format_exception(info.value)
    assert PLUGGY not in text and ACC_DIR not in text and "in acc_backward" not in text, text
    lines = text.splitlines()
    assert lines[0] == "Traceback (most recent call last):"
    assert "test_tracebacks.py" in lines[1] and "in _raise_through_a_hook" in lines[3], text  # the user's frames first
    assert "in backward" in text  # the user's Loss.backward (called by the backend) stays
    assert "json" in text.split("in backward")[1]  # then the library's frames, down to the one that raised
    assert lines[-1].startswith("(") and "hidden; ACC_DEBUG=1 shows every frame" in lines[-1]
    assert info.value.__traceback__ is not None and PLUGGY in "".join(
        __import__("traceback").format_tb(info.value.__traceback__))  # the exception itself keeps everything


def test_acc_debug_shows_every_frame(monkeypatch):
    monkeypatch.setenv("ACC_DEBUG", "1")
    with pytest.raises(ValueError) as info:
        _raise_through_a_hook()
    text = format_exception(info.value)
    assert PLUGGY in text and "hidden" not in text


def test_the_frame_that_raised_stays_even_inside_acc_and_causes_are_trimmed_too(monkeypatch):
    monkeypatch.delenv("ACC_DEBUG", raising=False)
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    from acc.errors import AccError
    from acc.runtime.distributed import launcher_facts

    def user():
        try:
            _raise_through_a_hook()
        except ValueError as exc:
            raise RuntimeError("while preparing") from exc

    with pytest.raises(AccError) as info:
        launcher_facts("ddp")  # raises in acc's own code
    text = format_exception(info.value)
    assert f"{ACC_DIR}runtime/distributed.py" in text and "in launcher_facts" in text, text  # the frame that raised
    with pytest.raises(RuntimeError) as info:
        user()
    text = format_exception(info.value)
    assert "JSONDecodeError" in text and "RuntimeError: while preparing" in text
    assert PLUGGY not in text and "in acc_backward" not in text, text  # the cause is trimmed as well


def test_an_uncaught_exception_in_a_script_is_printed_without_acc_frames(tmp_path):
    script = tmp_path / "fail.py"
    script.write_text(textwrap.dedent("""
        import torch
        from acc import Accelerator
        accelerator = Accelerator()
        model = accelerator.prepare(torch.nn.Linear(2, 1))
        loss = model(torch.ones(3, 2)).sum().detach()
        accelerator.backward(loss)  # the user's line
    """))
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=clean_env(tmp_path), capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    err = proc.stderr
    tb = err[err.index("Traceback (most recent call last):"):]
    frames = [ln for ln in tb.splitlines() if ln.startswith("  File ")]
    assert "fail.py" in frames[0] and "accelerator.backward(loss)" in tb, err
    assert not any(ACC_DIR in f or PLUGGY in f for f in frames), err
    assert "RuntimeError: element 0 of tensors does not require grad" in tb
