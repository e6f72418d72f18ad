"""What every handler of one server shares: config, backend, queue, permits and counters.

The permits are TEI's ``max_concurrent_requests`` semaphore, counted per input: a request takes
one permit per input without waiting, and if not all are free it takes none and gets 429
``Model is overloaded`` at once (``core/src/infer.rs`` ``try_acquire_permit``). Permits are held
until the request's inputs are computed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from teibatch.server.backends.base import Backend
from teibatch.server.batching import BatchQueue
from teibatch.server.config import ServerConfig
from teibatch.server.metrics import Metrics
from teibatch.server.responses import batch_size, overloaded


class Permits:
    """A non-blocking counting semaphore of ``total`` permits; the event loop is its only user."""

    def __init__(self, total: int, metrics: Metrics) -> None:
        self.total = total
        self.in_use = 0
        self.metrics = metrics

    @contextmanager
    def hold(self, count: int) -> Iterator[None]:
        """Take ``count`` permits for the block, or raise 429 (an ``inflight`` violation)."""
        if self.in_use + count > self.total:
            raise overloaded()
        self.in_use += count
        self.metrics.max_inflight_inputs = max(self.metrics.max_inflight_inputs, self.in_use)
        try:
            yield
        finally:
            self.in_use -= count


@dataclass
class ServerState:
    """One server's shared parts, held by its app under :data:`STATE`."""

    config: ServerConfig
    backend: Backend
    metrics: Metrics
    queue: BatchQueue
    permits: Permits

    def check_batch_size(self, count: int) -> None:
        """422 for more inputs than ``max_client_batch_size`` (an ``batch_size`` violation)."""
        self.metrics.max_inputs_per_request = max(self.metrics.max_inputs_per_request, count)
        if count > self.config.max_client_batch_size:
            raise batch_size(count, self.config.max_client_batch_size)

    def stats(self) -> dict[str, Any]:
        """The body of ``GET /teibatch/stats`` now (see :meth:`Metrics.stats`)."""
        return self.metrics.stats(inflight_inputs=self.permits.in_use, queue_size=self.queue.size)


STATE: web.AppKey[ServerState] = web.AppKey("teibatch_state", ServerState)


def route_of(request: web.Request) -> str | None:
    """The matched route's path template, or None for an unknown path."""
    match = request.match_info
    if match.http_exception is not None or match.route.resource is None:
        return None
    return match.route.resource.canonical
