"""Reading a scheduler's variables: whole numbers with errors that name the variable, the first of several names,
a port every machine of a job derives alike."""

from __future__ import annotations

import zlib
from typing import Mapping

from acc.cluster import ClusterError

PORT_BASE = 12000  # derived ports lie in 12000..31999: below Linux's ephemeral range (32768..60999)
PORT_SPAN = 20000


def first(environ: Mapping[str, str], *names: str) -> tuple[str, str] | None:
    """(name, value) of the first of `names` that is set, or None."""
    for name in names:
        if environ.get(name, "") != "":
            return name, environ[name]
    return None


def integer(environ: Mapping[str, str], name: str, minimum: int = 0) -> int:
    """The whole number in variable `name` (ClusterError naming it when it is not one, or below `minimum`)."""
    raw = environ.get(name)
    if raw is None:
        raise ClusterError(f"{name} is not set")
    try:
        value = int(raw.strip())
    except ValueError:
        raise ClusterError(f"{name}={raw!r} is not a whole number") from None
    if value < minimum:
        raise ClusterError(f"{name}={raw!r} is below {minimum}")
    return value


def port(environ: Mapping[str, str], name: str = "MASTER_PORT") -> int | None:
    """A port given in `name` (1..65535), or None when it is not set."""
    if environ.get(name, "") == "":
        return None
    value = integer(environ, name, minimum=1)
    if value > 65535:
        raise ClusterError(f"{name}={environ[name]!r} is not a port (1..65535)")
    return value


def job_port(job: int, step: int = 0) -> int:
    """The port every machine of job `job` (step `step`) derives alike: 12000 + (job x 100 + step) mod 20000, so
    consecutive jobs on one machine differ, and so do up to 100 steps of one job."""
    return PORT_BASE + (job * 100 + step) % PORT_SPAN


def text_port(text: str) -> int:
    """A port derived from a job-wide name (an MPI namespace): 12000 + crc32(text) mod 20000."""
    return PORT_BASE + zlib.crc32(text.encode()) % PORT_SPAN
