"""Fixtures of the mps backend's tests: the plugin registered directly, and MPS faked in one place.

`fake_mps` replaces `acc_mps.availability.mps_status`, the one function that decides whether MPS can be
used (launcher and worker side), with a fixed answer: an Apple Silicon Mac on which torch can use MPS.
Device selection then really returns `torch.device("mps")`; tests that would run tensors on it fake the
device-moving step on top (see each test), since this machine cannot.
"""

from __future__ import annotations

import platform

import pytest
import torch

import acc_mps.plugin
from acc.assembly.choose import assemble
from acc.assembly.plugins import register
from acc.contract.context import RunContext
from acc_mps import availability
from acc_mps.availability import MpsStatus, dotted

MPS_AVAILABLE = torch.backends.mps.is_available()

requires_mps = pytest.mark.skipif(
    not MPS_AVAILABLE,
    reason=f"needs an Apple Silicon Mac: torch.backends.mps.is_available() is False here (torch {torch.__version__}, "
           f"{platform.system()} {platform.machine()})",
)
requires_no_mps = pytest.mark.skipif(
    MPS_AVAILABLE, reason="checks the refusal where MPS is unavailable, and torch can use MPS here",
)


@pytest.fixture
def mps_pm(fresh_pm):
    """A plugin manager with the builtin cpu backend and the mps plugin."""
    register(fresh_pm, acc_mps.plugin, "mps")
    return fresh_pm


@pytest.fixture
def fake_mps(monkeypatch):
    """Fake MPS available (macOS 14.5); call the returned function to change the fake, e.g. macos=(13, 6)."""
    def fake(available: bool = True, macos: tuple[int, ...] = (14, 5), reason: str = "") -> MpsStatus:
        facts = {"platform": "Darwin arm64", "macOS": dotted(macos), "torch": torch.__version__,
                 "mps.is_built()": "True", "mps.is_available()": str(available)}
        status = MpsStatus(available, reason, macos, facts)
        monkeypatch.setattr(availability, "mps_status", lambda with_torch=True: status)
        return status

    fake()
    return fake


def mps_assembly(pm, **flags):
    """The launcher's assembly for backend mps with these flags (raw values, as from the command line)."""
    return assemble(flags={"backend": "mps", **flags}, pm=pm)


def mps_context(pm, **flags) -> RunContext:
    """A worker's run context for backend mps, set up by the hooks (acc_setup) as Accelerator() would."""
    ctx = RunContext(settings=mps_assembly(pm, **flags).settings, backend="mps")
    ctx.process = pm.hook.acc_setup(ctx=ctx)
    return ctx
