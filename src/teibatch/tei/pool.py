"""A pool of TEI servers: inputs-in-flight budgets, server choice, health and probing."""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field

from teibatch.errors import CapacityUnavailable
from teibatch.tei.client import TeiClient
from teibatch.tei.info import ClientLimits

DEFAULT_PROBE_INTERVAL_S = 1.0
DEFAULT_DOWN_GRACE_S = 30.0


@dataclass
class ServerStats:
    """What one client did with one server."""

    requests: int = 0
    inputs: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    def count_error(self, kind: str) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + 1

    def to_json(self) -> dict[str, object]:
        return {"requests": self.requests, "inputs": self.inputs, "retries": self.retries,
                "errors": dict(sorted(self.errors.items())), "seconds": round(self.seconds, 3)}


@dataclass
class Server:
    """One server as the pool sees it: its client, limits, inputs in flight and health."""

    client: TeiClient
    limits: ClientLimits
    in_flight: int = 0
    healthy: bool = True
    stats: ServerStats = field(default_factory=ServerStats)

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def free(self) -> int:
        return self.limits.max_inflight_inputs - self.in_flight


class EndpointPool:
    """Hands out servers with room for a request, never more inputs in flight than each one's limit.

    A server marked down is probed on ``/health`` in the background and comes back when it answers.
    With every server down for ``down_grace`` seconds, :meth:`acquire` raises :class:`CapacityUnavailable`.
    """

    def __init__(self, servers: list[Server], *, probe_interval: float = DEFAULT_PROBE_INTERVAL_S,
                 down_grace: float = DEFAULT_DOWN_GRACE_S) -> None:
        if not servers:
            raise CapacityUnavailable("no TEI server to send requests to")
        self.servers = servers
        self._probe_interval = probe_interval
        self._down_grace = down_grace
        self._changed = asyncio.Condition()
        self._probes: set[asyncio.Task[None]] = set()
        self._closed = False

    @property
    def max_batch_size(self) -> int:
        return min(s.limits.max_batch_size for s in self.servers)

    @property
    def payload_limit(self) -> int:
        return min(s.limits.payload_limit for s in self.servers)

    @property
    def capacity(self) -> int:
        """Inputs that may be in flight over all healthy servers."""
        return sum(s.limits.max_inflight_inputs for s in self.servers if s.healthy)

    async def acquire(self, count: int, avoid: str | None = None) -> Server:
        """Reserve ``count`` inputs on the healthy server with the most room (not ``avoid`` if possible)."""
        deadline: float | None = None
        async with self._changed:
            while True:
                server = self._pick(count, avoid)
                if server is not None:
                    server.in_flight += count
                    return server
                if any(s.healthy for s in self.servers):
                    deadline = None
                    await self._changed.wait()
                    continue
                deadline = deadline or time.monotonic() + self._down_grace
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    urls = ", ".join(s.url for s in self.servers)
                    raise CapacityUnavailable(
                        f"every TEI server stopped answering for {self._down_grace:.0f}s ({urls}); "
                        "the run stops here and the same command resumes it")
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._changed.wait(), timeout=remaining)

    def _pick(self, count: int, avoid: str | None) -> Server | None:
        ready = [s for s in self.servers if s.healthy and s.free >= count]
        if not ready:
            return None
        preferred = [s for s in ready if s.url != avoid] or ready
        return max(preferred, key=lambda s: s.free)

    async def release(self, server: Server, count: int) -> None:
        async with self._changed:
            server.in_flight -= count
            self._changed.notify_all()

    async def mark_down(self, server: Server) -> None:
        """Take ``server`` out of rotation and probe it until it answers ``/health`` again."""
        async with self._changed:
            if not server.healthy or self._closed:
                return
            server.healthy = False
            self._changed.notify_all()
        task = asyncio.create_task(self._probe(server))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _probe(self, server: Server) -> None:
        while not self._closed:
            await asyncio.sleep(self._probe_interval)
            if await server.client.healthy(timeout=max(1.0, self._probe_interval)):
                async with self._changed:
                    server.healthy = True
                    self._changed.notify_all()
                return

    async def close(self) -> None:
        self._closed = True
        for task in list(self._probes):
            task.cancel()
        await asyncio.gather(*self._probes, return_exceptions=True)

    def stats(self) -> dict[str, dict[str, object]]:
        return {s.url: s.stats.to_json() for s in self.servers}
