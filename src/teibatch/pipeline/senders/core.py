"""One sender's work, on its own event loop: a pool of its servers shared by every chunk sent to it.

Plain Python, with no Ray, so that it can be tested on its own; ``pipeline/senders/actor.py`` hosts
it in a Ray actor. What a sender is and why: ``pipeline/senders/__init__.py``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable, Iterable

import httpx

from teibatch.crashpoints import crashpoint
from teibatch.endpoint import Endpoint
from teibatch.pipeline.admission import OldestFirst
from teibatch.pipeline.senders.plans import SenderPlan, ServerPlan
from teibatch.tei import (
    EmbedResult,
    EndpointPool,
    RequestPacker,
    Server,
    TeiClient,
    embed_texts,
    open_client,
)

# Connections a sender opens to each server before the first chunk (TEI's defaults take 16 requests),
# and how long it waits for one.
CONNECTIONS_AHEAD = 16
CONNECT_TIMEOUT_S = 5.0


class Streams:
    """Which shards' texts have all been sent here, and which shards the driver said are the last ones."""

    def __init__(self) -> None:
        self.last: frozenset[str] | None = None
        self.done: set[str] = set()
        self.changed: Callable[[], None] = lambda: None

    def finished(self, stream: str) -> None:
        """Shard ``stream`` has sent its last chunk (or its task ended)."""
        if stream not in self.done:
            self.done.add(stream)
            self.changed()

    def last_ones(self, streams: Iterable[str]) -> None:
        """No shard other than ``streams`` will send anything any more."""
        self.last = frozenset(streams)
        self.changed()

    def all_in(self) -> bool:
        """Every text of the run has been sent to this sender."""
        return self.last is not None and self.last <= self.done


class ServerClients:
    """A sender's HTTP clients: one per server (each its own connection pool), opened before they are needed.

    One per server (:func:`~teibatch.tei.transport.open_client`), so a server's connections are
    never looked through for another's. No cap on connections: the sender never has more requests
    in flight to a server than its limits allow (plus the probe of a server taken out), and a
    connection opened stays open for the next request.
    """

    def __init__(self) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._opening: dict[str, asyncio.Future[list[object]]] = {}

    def get(self, url: str) -> httpx.AsyncClient:
        """The client of the server at ``url``."""
        if url not in self._clients:
            self._clients[url] = open_client([url])
        return self._clients[url]

    async def open(self, endpoints: Iterable[Endpoint], per_server: int, api_key_env: str | None) -> None:
        """Open ``per_server`` connections to each of ``endpoints`` not opened yet (waits for those being opened).

        ``/info`` on each, all at once: answered by TEI's router, never queued behind a batch.
        Opening a connection costs the sender CPU; opened together with the first requests, they
        would all be opened before the first request is written, and the servers would wait for
        every one of them. Best effort: a server that does not answer is found, and
        dealt with, by the chunks.
        """
        opening = []
        for endpoint in endpoints:
            if endpoint.url not in self._opening:
                client = TeiClient(endpoint, self.get(endpoint.url), timeout=CONNECT_TIMEOUT_S, api_key_env=api_key_env)
                self._opening[endpoint.url] = asyncio.gather(*(client.info() for _ in range(per_server)),
                                                             return_exceptions=True)
            opening.append(self._opening[endpoint.url])
        # Shielded: one caller cancelled leaves the connections opening for the others.
        await asyncio.shield(asyncio.gather(*opening))

    async def close(self) -> None:
        for client in self._clients.values():
            await client.aclose()


class SenderCore:
    """One sender's work, on its own event loop: a pool of its servers shared by every chunk.

    Plain Python so that it can be tested without Ray; ``SenderActor`` (``actor.py``) hosts it in Ray.
    """

    def __init__(self, plan: SenderPlan, streams: Streams | None = None, clients: ServerClients | None = None) -> None:
        self.plan = plan
        self.dimension = plan.dimension  # None until the servers' probe (see :meth:`probed`)
        self.streams = streams or Streams()
        self.clients = clients or ServerClients()
        self._pool: EndpointPool | None = None
        self._packer: RequestPacker | None = None
        self._admission: OldestFirst | None = None
        self._reported: dict[str, tuple[int, int]] = {}
        self.chunks = 0

    def _start(self) -> tuple[EndpointPool, RequestPacker, OldestFirst]:
        if self._pool is None or self._packer is None or self._admission is None:
            plan = self.plan
            servers = [self._server_for(p) for p in plan.servers]
            self._pool = EndpointPool(servers)
            self._packer = RequestPacker(plan.route, plan.embed, max_batch_size=self._pool.max_batch_size,
                                         payload_limit=self._pool.payload_limit)
            self._pool.probe_request = self._packer.probe()
            # Enough chunks sending at once to fill every window, plus two starting while others end
            # (a chunk whose texts are all sent gives its slot up: pipeline/admission.py).
            self._admission = OldestFirst(math.ceil(plan.budget / plan.chunk_size) + 2)
            admission = self._admission
            self._pool.all_work_in = lambda: self.streams.all_in() and not admission.waiting
            self.streams.changed = self._pool.wake
        return self._pool, self._packer, self._admission

    @property
    def pool(self) -> EndpointPool:
        """The pool of this sender's servers (set up on first use)."""
        return self._start()[0]

    def probed(self, dimension: int) -> None:
        """Take the vector size the servers' probe showed: from now on every answer is checked against it."""
        if self.dimension is None:
            self.dimension = dimension
            for server in self._pool.servers if self._pool is not None else ():
                server.client.expected_dimension = dimension

    async def connect(self) -> None:
        """Set up the pool and open the connections its first requests will use (:meth:`ServerClients.open`)."""
        pool = self.pool
        await self.clients.open((server.client.endpoint for server in pool.servers),
                                min(max(server.max_requests for server in pool.servers), CONNECTIONS_AHEAD),
                                self.plan.api_key_env)

    async def embed(self, texts: list[str], priority: float = 0.0) -> EmbedResult:
        """Vectors (or a failure) for every text, sent over this sender's servers.

        ``priority``: the start time of the shard task that sent them; the oldest task's chunks go first.
        """
        if self.dimension is None:
            raise RuntimeError("a sender embeds only once the servers' probe has shown their vector size")
        pool, packer, admission = self._start()
        async with admission.slot(priority) as give_back:
            self.chunks += 1
            crashpoint("sender-chunk")
            return await embed_texts(pool, packer, texts, dimension=self.dimension,
                                     max_retries=self.plan.max_retries, all_sent=give_back)

    def lose(self, url: str, replacement_coming: bool) -> bool:
        """The cloud took the server at ``url`` back (see :meth:`EndpointPool.lose`); with
        ``replacement_coming``, the pool waits for :meth:`add` rather than give up with no server left."""
        pool = self.pool
        if replacement_coming:
            pool.expect()
        lost = pool.lose(url)
        if lost:  # the driver says so itself: news() stays quiet about it
            server = next(s for s in pool.servers if s.url == url)
            self._reported[url] = (sum(server.stats.errors.values()), server.stats.marked_down)
        return lost

    async def add(self, server: ServerPlan) -> None:
        """A replacement server joins this sender's pool; its connections are opened first."""
        pool = self.pool
        await self.clients.open([server.endpoint], min(server.limits.max_requests, CONNECTIONS_AHEAD),
                                self.plan.api_key_env)
        pool.add(self._server_for(server))
        self.plan = self.plan.with_server(server)

    def not_coming(self) -> None:
        """A replacement announced by :meth:`lose` will not come."""
        self.pool.unexpect()

    def _server_for(self, server: ServerPlan) -> Server:
        plan = self.plan
        return Server(TeiClient(server.endpoint, self.clients.get(server.endpoint.url), timeout=plan.request_timeout,
                                model=plan.model_id, api_key_env=plan.api_key_env,
                                expected_dimension=self.dimension, normalized=plan.embed.normalize), server.limits)

    def stats(self) -> dict[str, dict[str, object]]:
        """Per server: requests, inputs, retries, errors, max in flight, busy share (see ``ServerStats``)."""
        return self._pool.stats() if self._pool is not None else {}

    def news(self) -> list[str]:
        """Lines about faults since the last call: failed requests per server and servers taken out."""
        if self._pool is None:
            return []
        lines = []
        for server in self._pool.servers:
            errors = sum(server.stats.errors.values())
            seen_errors, seen_down = self._reported.get(server.url, (0, 0))
            if errors > seen_errors and server.last_error is not None:
                fault = str(server.last_error).removeprefix(f"{server.url}: ")
                action = "taken out, probing it" if not server.healthy else "retrying elsewhere"
                lines.append(f"{server.url}: {errors - seen_errors} failed request(s) ({fault}); {action}")
            elif server.stats.marked_down > seen_down and server.healthy:
                lines.append(f"{server.url}: answering correctly again, back in rotation")
            self._reported[server.url] = (errors, server.stats.marked_down)
        return lines

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
        await self.clients.close()

