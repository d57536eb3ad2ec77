"""Running commands for tests (part of Accelerate's `accelerate.test_utils.testing`, which re-exports these):
`execute_subprocess_async` streams a command's output while it runs, `run_command` returns it, and the rendezvous
port for a pytest-xdist worker. Torch-free; imports nothing of acc.
"""

from __future__ import annotations

import asyncio
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


class _RunOutput:
    """What a finished subprocess gave: its return code and its output lines (stdout, stderr)."""

    def __init__(self, returncode: int, stdout: list[str], stderr: list[str]):
        self.returncode = returncode
        self.stdout = stdout
        self.stderr = stderr


async def _pump(stream: asyncio.StreamReader, sink: list[str], echo_to: Any, label: str) -> None:
    async for raw in stream:
        line = raw.decode("utf-8", errors="replace").rstrip()
        sink.append(line)
        if echo_to is not None:
            print(label, line, file=echo_to)


async def _run_streaming(cmd: list[str], env: dict | None, stdin: Any, timeout: float | None,
                         quiet: bool) -> _RunOutput:
    proc = await asyncio.create_subprocess_exec(*cmd, stdin=stdin, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.PIPE, env=env)
    out: list[str] = []
    err: list[str] = []
    pumps = asyncio.gather(_pump(proc.stdout, out, None if quiet else sys.stdout, "stdout:"),
                           _pump(proc.stderr, err, None if quiet else sys.stderr, "stderr:"))
    try:
        await asyncio.wait_for(pumps, timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise RuntimeError(f"'{' '.join(cmd)}' did not finish within {timeout} s and was killed\n\n"
                           "Its stderr so far:\n" + "\n".join(err)) from None
    return _RunOutput(await proc.wait(), out, err)


def execute_subprocess_async(cmd: list, env: dict | None = None, stdin: Any = None, timeout: float | None = 180,
                             quiet: bool = False, echo: bool = True) -> _RunOutput:
    """Run `cmd` (Paths allowed), echoing its output lines prefixed `stdout:` / `stderr:` as they come (unless
    `quiet`); a non-zero exit, or running past `timeout` seconds, raises RuntimeError with its stderr."""
    cmd[:] = [str(part) if isinstance(part, Path) else part for part in cmd]
    if echo:
        print("\nRunning: ", " ".join(cmd))
    result = asyncio.run(_run_streaming(cmd, env, stdin, timeout, quiet))
    if result.returncode != 0:
        raise RuntimeError(f"'{' '.join(cmd)}' failed with returncode {result.returncode}\n\n"
                           "The combined stderr from workers follows:\n" + "\n".join(result.stderr))
    return result


def pytest_xdist_worker_id() -> int:
    """This pytest-xdist worker's number (gw3 -> 3); 0 without xdist."""
    match = re.fullmatch(r"gw(\d+)", os.environ.get("PYTEST_XDIST_WORKER", "gw0"))
    return int(match.group(1)) if match else 0


def get_torch_dist_unique_port() -> int:
    """A rendezvous port for this test worker: 29500 plus the pytest-xdist worker number."""
    return 29500 + pytest_xdist_worker_id()


class SubprocessCallException(Exception):
    """A command run by `run_command` failed; the message holds its output."""


def run_command(command: list, return_stdout: bool = False, env: dict | None = None) -> str | None:
    """Run `command` (Paths allowed) with stderr folded into stdout; its output when `return_stdout`. A non-zero exit
    raises SubprocessCallException with the output."""
    command[:] = [str(part) if isinstance(part, Path) else part for part in command]
    try:
        output = subprocess.check_output(command, stderr=subprocess.STDOUT,
                                         env=os.environ.copy() if env is None else env)
    except subprocess.CalledProcessError as exc:
        raise SubprocessCallException(f"Command `{' '.join(command)}` failed with the following error:\n\n"
                                      f"{exc.output.decode(errors='replace')}") from exc
    return output.decode("utf-8", errors="replace") if return_stdout else None


__all__ = ["SubprocessCallException", "execute_subprocess_async", "get_torch_dist_unique_port",
           "pytest_xdist_worker_id", "run_command"]
