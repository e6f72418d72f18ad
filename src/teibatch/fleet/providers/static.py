"""Provider ``static``: TEI servers that already run, given by URL."""

from __future__ import annotations

import logging
import time

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable
from teibatch.fleet.base import LaunchSpec, Provider, wait_healthy

log = logging.getLogger(__name__)


class StaticProvider(Provider):
    """Adopts running servers; launches nothing, so ``down`` has nothing to destroy.

    Servers that do not answer ``/health`` within ``startup_timeout`` are left out with a warning;
    with none answering, ``up`` raises :class:`CapacityUnavailable`.
    """

    name = "static"

    def __init__(self, urls: list[str], *, api_key: str | None = None, startup_timeout: float = 30.0,
                 payload_limit: int | None = None, payload_limits: dict[str, int] | None = None) -> None:
        """``payload_limit`` is every server's request body limit, ``payload_limits`` one per URL."""
        self.urls = urls
        self.api_key = api_key
        self.startup_timeout = startup_timeout
        self.payload_limit = payload_limit
        self.payload_limits = dict(payload_limits or {})

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        deadline = time.monotonic() + self.startup_timeout
        healthy = []
        for url in self.urls:
            if wait_healthy(url, deadline):
                healthy.append(Endpoint(url, self.api_key, self.payload_limits.get(url, self.payload_limit)))
            else:
                log.warning("%s: no answer on /health within %.0fs; going on without it",
                            url, self.startup_timeout)
        if not healthy:
            raise CapacityUnavailable(
                f"none of the {len(self.urls)} servers in servers.urls answered /health within "
                f"{self.startup_timeout:.0f}s: {', '.join(self.urls)}")
        return healthy

    def down(self) -> None:
        """Nothing to do: these servers were running before the job and keep running after it."""
