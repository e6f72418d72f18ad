"""Fixtures for the built-in server's tests: a running default server and an HTTP client for it."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from teibatch.server.testing import running_server


@pytest.fixture
def server_url() -> Iterator[str]:
    """A default server (TEI defaults, hashing backend) in a thread, stopped after the test."""
    with running_server() as url:
        yield url


@pytest.fixture
def client(server_url: str) -> Iterator[httpx.Client]:
    """An httpx client bound to :func:`server_url`."""
    with httpx.Client(base_url=server_url, timeout=10) as c:
        yield c
