"""Fixtures of the integration tests."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from tests.integration.sockets import namespace_with_a_public_host_name, two_hosts_joined


def entered_or_skipped(context: Any) -> Iterator[Any]:
    """What a fixture yields for a network-namespace context manager: its value while it is entered, or a skip
    saying why namespaces could not be made here."""
    try:
        value = context.__enter__()
    except OSError as exc:
        pytest.skip(f"network namespaces are not available here: {exc}")
    try:
        yield value
    finally:
        context.__exit__(None, None, None)


@pytest.fixture
def two_hosts():
    """Two network namespaces joined by a veth pair (10.77.<n>.1 and .2): for each, (the command prefix that runs a
    program there, its address, its interface); or a skip saying what failed."""
    yield from entered_or_skipped(two_hosts_joined("10.77"))


@pytest.fixture
def public_host():
    """A network namespace where this machine's host name resolves to its one non-loopback address (10.78.n.1):
    (the command prefix that runs a program there, that address); or a skip saying what failed."""
    yield from entered_or_skipped(namespace_with_a_public_host_name())
