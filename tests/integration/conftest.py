"""Fixtures of the integration tests."""

from __future__ import annotations

import pytest

from tests.integration.sockets import two_hosts_joined


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair (10.77.<n>.1 and .2): for each, (the command prefix that runs a
    program there, its address, its interface); or a skip saying what failed."""
    try:
        context = two_hosts_joined("10.77")
        hosts = context.__enter__()
    except OSError as exc:
        pytest.skip(f"network namespaces are not available here: {exc}")
    try:
        yield hosts
    finally:
        context.__exit__(None, None, None)
