"""The provider interface: what every way of getting TEI servers has in common."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from contextlib import contextmanager

import httpx

from teibatch.endpoint import Endpoint

HEALTH_POLL_S = 0.2


class Provider(ABC):
    """Gives TEI endpoints for one run, and takes back what it launched.

    ``up`` launches or adopts servers and returns only when each returned endpoint answers
    ``/health`` (or raises :class:`~teibatch.errors.CapacityUnavailable`). ``down`` stops or destroys
    everything ``up`` launched; it is idempotent and safe to call after a failed or partial ``up``.
    """

    name: str

    @abstractmethod
    def up(self) -> list[Endpoint]: ...

    @abstractmethod
    def down(self) -> None: ...


@contextmanager
def running(provider: Provider) -> Iterator[list[Endpoint]]:
    """``provider.up()`` for the duration of the block; ``down()`` however the block ends."""
    try:
        yield provider.up()
    finally:
        provider.down()


def wait_healthy(url: str, deadline: float, *, alive: object = None) -> bool:
    """Poll ``url/health`` until it answers 200 or ``deadline`` (monotonic) passes.

    ``alive``, when given, is a callable returning False once the server process has died,
    which ends the wait early.
    """
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if callable(alive) and not alive():
                return False
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
    return False
