"""Senders: the few long-lived processes that talk to the TEI servers for a whole run.

Why they exist: a server's ``max_concurrent_requests`` is one budget, counted in inputs across
every client. Split up front between shard tasks, each slice sits idle while its task reads,
hashes or writes Parquet, and slices smaller than a batch shrink every request. So every server
is owned by exactly one sender for the whole run, which holds its *whole* budget and one adaptive
window (``tei/pool.py``); shard tasks stream their texts to the senders in chunks and get the
vectors back through Ray's object store. Whatever is sending right now uses the whole budget, the
last shard of a run included, and a task that is reading or writing holds none of it.

* How many senders: one per ``SERVERS_PER_SENDER`` servers (servers, not CPUs, size them); each
  is an asyncio actor with ``num_cpus=0`` placed on the driver's node (where SSH tunnels end).
* What a chunk is: ``CHUNK_BATCHES`` full requests' worth of texts, so sharing never shrinks a
  request: only the last chunk of a shard may end in a smaller one.
* Inside a sender, chunks are admitted oldest shard task first (``pipeline/admission.py``); enough
  of them at once to fill every server's window, and no more, so a chunk's requests go out together
  and it comes back soon, and tasks finish one after another instead of all at once.
* At the end of a run, idle servers take copies of the requests that would land last (tail
  hedging, ``tei/hedging.py``). A sender allows it once it knows no more texts will come: the driver
  names the shards still running when it has started the last task (:meth:`SenderActor.last_streams`),
  and each shard says when it has sent its last chunk (:meth:`SenderActor.stream_done`; the driver
  says it for a task that ended without doing so).
* The run's first requests are sent by the driver itself (``pipeline/first_wave.py``) until the
  senders are running (:meth:`SenderActor.running`). A plan says how many inputs the driver may
  have in flight at each server (``SenderPlan.held``): they count against the sender's window until
  the driver gives them back (:meth:`SenderActor.others_released`); its requests count in the
  sender's report (:meth:`SenderActor.others_landed`); the chunks of those texts wait in the
  sender for the driver's vectors (:meth:`SenderActor.deposit`), the sender embedding only what the
  driver did not get.
* A sender that dies (its process, or its node) is restarted by Ray with fresh, full windows; the
  chunks it held fail in the shard task, which sends them again (bounded). A shard task that dies
  leaves nothing counted anywhere: in-flight counts live only inside the sender that sends. A
  restarted sender does not know which shards are done, and never copies requests; like the
  requests its predecessor left in the servers' queues, the driver's first wave is no longer
  counted in it (it takes no hold and waits for no vectors from the driver).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import math
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from itertools import islice
from typing import Any, TypeVar

import httpx
import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from teibatch.crashpoints import crashpoint, task_environment
from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, TeibatchError
from teibatch.pipeline.admission import OldestFirst
from teibatch.pipeline.head_start import HeadStart, texts_digest
from teibatch.tei import (
    ClientLimits,
    EmbedOptions,
    EmbedResult,
    EndpointPool,
    RequestPacker,
    Server,
    TeiClient,
    embed_texts,
    tls_context,
    tls_settings,
)

T = TypeVar("T")

SERVERS_PER_SENDER = 4
CHUNK_BATCHES = 8
# A task keeps this many of a sender's budgets outstanding there (plus a chunk): enough queued in the
# sender that a server never waits for a task to be scheduled, even on a busy machine.
OUTSTANDING_BUDGETS = 2
MAX_SENDER_RESTARTS = 5
MAX_CHUNK_RESENDS = 3
# How long a shard task waits for one chunk before it asks again whether its sender still lives.
WAIT_SLICE_S = 5.0
# Connections a sender opens to each server before the first chunk (TEI's defaults take 16 requests),
# and how long it waits for one.
CONNECTIONS_AHEAD = 16
CONNECT_TIMEOUT_S = 5.0
# How long a chunk of the driver's first wave waits for the driver's vectors, in request timeouts (plus
# a margin): the driver's requests have timed out by then, and the sender embeds the chunk itself.
WAVE_WAIT_TIMEOUTS = 2
WAVE_WAIT_MARGIN_S = 30.0


@dataclass(frozen=True)
class ServerPlan:
    """One server as its sender sees it: where, and the limits the job allows towards it."""

    endpoint: Endpoint
    limits: ClientLimits


@dataclass(frozen=True)
class SenderPlan:
    """What one sender needs: its servers (with their whole limits) and how to talk to them.

    ``dimension`` is ``None`` until the servers' probe has shown it: a sender given such a plan
    connects to its servers, and the chunks sent with it (the driver's head start) wait in the
    sender until it has the probed plan.

    ``held``: per server, in order, the inputs the driver's first wave may have in flight there
    (``pipeline/first_wave.py``); empty when there is none.
    """

    servers: tuple[ServerPlan, ...]
    route: str
    embed: EmbedOptions
    dimension: int | None
    model_id: str | None = None
    api_key_env: str | None = None
    request_timeout: float = 60.0
    max_retries: int = 6
    held: tuple[int, ...] = ()

    @property
    def budget(self) -> int:
        """Inputs this sender may keep in flight over all its servers."""
        return sum(p.limits.max_inflight_inputs for p in self.servers)

    @property
    def chunk_size(self) -> int:
        """Texts in one chunk: ``CHUNK_BATCHES`` full requests to the largest batch among its servers."""
        return CHUNK_BATCHES * max(p.limits.max_batch_size for p in self.servers)


def sender_count(servers: int) -> int:
    """How many senders share ``servers`` servers: one per ``SERVERS_PER_SENDER``."""
    return max(1, math.ceil(servers / SERVERS_PER_SENDER))


def plan_senders(servers: Sequence[ServerPlan], *, route: str, embed: EmbedOptions, dimension: int | None,
                 model_id: str | None, api_key_env: str | None, request_timeout: float,
                 max_retries: int, held: Mapping[str, int] | None = None) -> list[SenderPlan]:
    """One plan per sender, with its share of ``servers`` (:func:`split_servers`).

    ``held``: per server URL, the inputs the driver's first wave may have in flight there.
    """
    held = held or {}
    return [SenderPlan(tuple(own), route, embed, dimension, model_id, api_key_env, request_timeout, max_retries,
                       tuple(held.get(p.endpoint.url, 0) for p in own) if held else ())
            for own in split_servers(servers)]


def split_servers(servers: Sequence[T]) -> list[Sequence[T]]:
    """``servers`` split between ``ceil(len / SERVERS_PER_SENDER)`` senders, round robin."""
    count = sender_count(len(servers))
    return [servers[i::count] for i in range(count)]


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

    One per server: httpcore's pool scans every connection it holds on each request and answer
    (twice over for idle ones), so one pool shared by every server costs the sender the square of
    their connections per request. No cap on connections: the sender's pool never has more
    requests in flight to a server than its limits allow (plus the probe of a server taken out),
    and a connection opened stays open for the next request.
    """

    def __init__(self) -> None:
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._opening: dict[str, asyncio.Future[list[object]]] = {}

    def get(self, url: str) -> httpx.AsyncClient:
        """The client of the server at ``url``."""
        if url not in self._clients:
            self._clients[url] = httpx.AsyncClient(verify=tls_settings(url), limits=httpx.Limits(
                max_connections=None, max_keepalive_connections=None))
        return self._clients[url]

    async def open(self, endpoints: Iterable[Endpoint], per_server: int, api_key_env: str | None) -> None:
        """Open ``per_server`` connections to each of ``endpoints`` not opened yet (waits for those being opened).

        ``/info`` on each, all at once: answered by TEI's router, never queued behind a batch.
        Opening a connection costs the sender a millisecond or two of CPU; opened together with the
        first requests, they would all be opened before the first request is written, and the
        servers would wait that long. Best effort: a server that does not answer is found, and
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

    Plain Python so that it can be tested without Ray; :class:`SenderActor` hosts it in Ray.
    """

    def __init__(self, plan: SenderPlan, streams: Streams | None = None, clients: ServerClients | None = None, *,
                 takes_holds: bool = True) -> None:
        self.plan = plan
        self.dimension = plan.dimension  # None until the servers' probe (see :meth:`probed`)
        self.streams = streams or Streams()
        self.clients = clients or ServerClients()
        self.takes_holds = takes_holds  # False in a restarted sender (see the module's docstring)
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
            if self.takes_holds:
                for server, held in zip(servers, plan.held, strict=False):
                    self._pool.hold(server, held)
            self._packer = RequestPacker(plan.route, plan.embed, max_batch_size=self._pool.max_batch_size,
                                         payload_limit=self._pool.payload_limit)
            self._pool.probe_request = self._packer.probe()
            # Enough chunks at once to fill every window, plus two starting while others end.
            self._admission = OldestFirst(math.ceil(plan.budget / plan.chunk_size) + 2)
            admission = self._admission
            self._pool.all_work_in = lambda: self.streams.all_in() and not admission.waiting
            self.streams.changed = self._pool.wake
        return self._pool, self._packer, self._admission

    def probed(self, dimension: int) -> None:
        """Take the vector size the servers' probe showed: from now on every answer is checked against it."""
        if self.dimension is None:
            self.dimension = dimension
            for server in self._pool.servers if self._pool is not None else ():
                server.client.expected_dimension = dimension

    async def connect(self) -> None:
        """Set up the pool and open the connections its first requests will use (:meth:`ServerClients.open`)."""
        pool, _, _ = self._start()
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
        async with admission.slot(priority):
            self.chunks += 1
            crashpoint("sender-chunk")
            return await embed_texts(pool, packer, texts, dimension=self.dimension,
                                     max_retries=self.plan.max_retries)

    async def embed_rest(self, texts: list[str], done: EmbedResult, priority: float = 0.0) -> EmbedResult:
        """``done`` (the driver's vectors for some of ``texts``), completed: the other texts embedded here."""
        missing = np.flatnonzero(~done.ok)
        if not len(missing):
            return done
        rest = await self.embed([texts[i] for i in missing], priority)
        # ``dimension`` is set here: :meth:`embed` refuses to run without it.
        return EmbedResult.assembled(len(texts), self.dimension or 0, [(0, done), (missing, rest)])

    def others_landed(self, url: str, requests: int, inputs: int, seconds: float, first_sent: float,
                      errors: Mapping[str, int]) -> None:
        """What the driver's first wave did at ``url`` (see :meth:`EndpointPool.others_landed`)."""
        pool, server = self._server(url)
        if server is not None:
            pool.others_landed(server, requests=requests, inputs=inputs, seconds=seconds, first_sent=first_sent,
                               errors=errors)

    def others_released(self, url: str, inputs: int) -> None:
        """The driver gave back ``inputs`` of what it held at ``url`` (see :meth:`EndpointPool.release_held`)."""
        pool, server = self._server(url)
        if server is not None:
            pool.release_held(server, inputs)

    def lose(self, url: str, replacement_coming: bool) -> bool:
        """The cloud took the server at ``url`` back (see :meth:`EndpointPool.lose`); with
        ``replacement_coming``, the pool waits for :meth:`add` rather than give up with no server left."""
        pool, _, _ = self._start()
        if replacement_coming:
            pool.expect()
        lost = pool.lose(url)
        if lost:  # the driver says so itself: news() stays quiet about it
            server = next(s for s in pool.servers if s.url == url)
            self._reported[url] = (sum(server.stats.errors.values()), server.stats.marked_down)
        return lost

    async def add(self, server: ServerPlan) -> None:
        """A replacement server joins this sender's pool; its connections are opened first."""
        pool, _, _ = self._start()
        await self.clients.open([server.endpoint], min(server.limits.max_requests, CONNECTIONS_AHEAD),
                                self.plan.api_key_env)
        pool.add(self._server_for(server))
        self.plan = replace(self.plan, servers=(*self.plan.servers, server), held=())

    def not_coming(self) -> None:
        """A replacement announced by :meth:`lose` will not come."""
        pool, _, _ = self._start()
        pool.unexpect()

    def _server_for(self, server: ServerPlan) -> Server:
        plan = self.plan
        return Server(TeiClient(server.endpoint, self.clients.get(server.endpoint.url), timeout=plan.request_timeout,
                                model=plan.model_id, api_key_env=plan.api_key_env,
                                expected_dimension=self.dimension, normalized=plan.embed.normalize), server.limits)

    def _server(self, url: str) -> tuple[EndpointPool, Server | None]:
        pool, _, _ = self._start()
        return pool, next((server for server in pool.servers if server.url == url), None)

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


class SenderActor:
    """The Ray actor around a :class:`SenderCore` (async methods: chunks run concurrently).

    It is created with its servers' addresses, before anything else is known of them, and opens
    connections to them at once, while Ray readies it for its first call (a tenth of a second or
    more). Its plan comes with every chunk, so that a restarted actor (Ray calls ``__init__``
    again) has it from the first chunk it is sent. A plan without a dimension (sent before the
    servers' probe) sets the sender up; chunks sent with one wait until a probed plan comes with
    another call.
    """

    def __init__(self, servers: Sequence[Endpoint] = (), api_key_env: str | None = None) -> None:
        self.core: SenderCore | None = None
        self.streams = Streams()
        self.clients = ServerClients()
        self._https = any(server.url.startswith("https:") for server in servers)
        self._probed = asyncio.Event()
        # The driver's first wave: its vectors per chunk, and its requests back before this sender had a plan.
        self.restarted = _restarted()
        self._deposits: dict[int, asyncio.Future[EmbedResult]] = {}
        self._driver_early: list[Callable[[SenderCore], None]] = []  # what the driver said before the plan came
        self._connecting: asyncio.Task[None] | None = None
        if servers:
            with contextlib.suppress(RuntimeError):  # no event loop: built outside Ray, connects when called
                self._connecting = asyncio.get_running_loop().create_task(
                    self.clients.open(servers, CONNECTIONS_AHEAD, api_key_env))

    async def warm(self) -> None:
        """Finish the one-time set-up: :func:`~teibatch.tei.client.tls_context` (for HTTPS), the connections.

        Also moves every object alive now (Ray's, the imported modules', the connections') out of
        the garbage collector's sight: a full collection scanned them all, a 50-70 ms pause in which
        no answer became a new request.
        """
        if self._https:
            tls_context()
        if self._connecting is not None:
            await self._connecting
        gc.freeze()

    async def prepare(self, plan: SenderPlan) -> None:
        """Take ``plan`` and connect to its servers (once), while the servers are probed or the first tasks start."""
        await self._core(plan).connect()

    async def embed(self, texts: list[str], priority: float, plan: SenderPlan, wave: int | None = None) -> EmbedResult:
        """Vectors for ``texts``.

        ``wave``: the driver sends these texts itself (``pipeline/first_wave.py``); this sender takes
        its vectors and embeds only the texts it did not get.
        """
        core = self._core(plan)
        if core.dimension is None:
            await self._probed.wait()
        if wave is not None and not self.restarted:
            done = await self._deposit(wave, plan)
            if done is not None:
                return await core.embed_rest(texts, done, priority)
        return await core.embed(texts, priority)

    async def deposit(self, wave: int, result: EmbedResult) -> None:
        """The driver's vectors for the chunk sent with ``wave`` (``ok`` marks the texts it got)."""
        future = self._deposits.setdefault(wave, asyncio.get_running_loop().create_future())
        if not future.done():
            future.set_result(result)

    async def others_landed(self, url: str, requests: int, inputs: int, seconds: float, first_sent: float,
                            errors: dict[str, int]) -> None:
        """What the driver's first wave did at ``url``, all of it back: counted in this sender's report."""
        self._from_driver(lambda core: core.others_landed(url, requests, inputs, seconds, first_sent, errors))

    async def others_released(self, url: str, inputs: int) -> None:
        """The driver gave back ``inputs`` of what it held at ``url``: they are this sender's to use."""
        self._from_driver(lambda core: core.others_released(url, inputs))

    async def running(self) -> None:
        """Returns once this sender can send: it has the probed plan and its connections are open."""
        await self._probed.wait()
        if self._connecting is not None:
            await self._connecting

    def _from_driver(self, news: Callable[[SenderCore], None]) -> None:
        if self.restarted:
            return  # a restarted sender took no hold: nothing the driver says about it applies
        if self.core is None:
            self._driver_early.append(news)
        else:
            news(self.core)

    async def _deposit(self, wave: int, plan: SenderPlan) -> EmbedResult | None:
        """The driver's vectors for chunk ``wave``; None if they do not come in time (its requests timed out)."""
        future = self._deposits.setdefault(wave, asyncio.get_running_loop().create_future())
        try:
            return await asyncio.wait_for(future, WAVE_WAIT_TIMEOUTS * plan.request_timeout + WAVE_WAIT_MARGIN_S)
        except TimeoutError:
            return None
        finally:
            self._deposits.pop(wave, None)

    async def stream_done(self, stream: str) -> None:
        """Shard ``stream`` has sent its last chunk (see :class:`Streams`)."""
        self.streams.finished(stream)

    async def last_streams(self, streams: list[str]) -> None:
        """Only ``streams`` may still send chunks (see :class:`Streams`)."""
        self.streams.last_ones(streams)

    def _core(self, plan: SenderPlan) -> SenderCore:
        if self.core is None:
            self.core = SenderCore(plan, self.streams, self.clients, takes_holds=not self.restarted)
            for news in self._driver_early:
                news(self.core)
            self._driver_early.clear()
        if plan.dimension is not None:
            self.core.probed(plan.dimension)
            self._probed.set()
        return self.core

    async def lose(self, url: str, replacement_coming: bool, plan: SenderPlan) -> bool:
        """The cloud took the server at ``url`` back (:meth:`SenderCore.lose`)."""
        return self._core(plan).lose(url, replacement_coming)

    async def add(self, server: ServerPlan, plan: SenderPlan) -> None:
        """A replacement server joins this sender (:meth:`SenderCore.add`)."""
        await self._core(plan).add(server)

    async def not_coming(self, plan: SenderPlan) -> None:
        """A replacement announced with :meth:`lose` will not come."""
        self._core(plan).not_coming()

    async def stats(self) -> dict[str, dict[str, object]]:
        return self.core.stats() if self.core is not None else {}

    async def news(self) -> list[str]:
        return self.core.news() if self.core is not None else []

    async def close(self) -> None:
        if self.core is not None:
            await self.core.close()


def _restarted() -> bool:
    """Whether this is a Ray actor that Ray restarted (False outside Ray)."""
    if not ray.is_initialized():
        return False  # tests build senders directly
    with warnings.catch_warnings():  # Ray's own property reads a deprecated one
        warnings.simplefilter("ignore", DeprecationWarning)
        try:
            return bool(ray.get_runtime_context().was_current_actor_reconstructed)
        except Exception:  # not an actor
            return False


@dataclass(frozen=True)
class SenderRef:
    """A sender as shard tasks see it: the actor handle and the shape of its work."""

    actor: Any  # ray.actor.ActorHandle of SenderActor
    plan: SenderPlan

    @property
    def budget(self) -> int:
        return self.plan.budget

    @property
    def chunk_size(self) -> int:
        return self.plan.chunk_size


def launch_senders(groups: Sequence[Sequence[Endpoint]], api_key_env: str | None = None) -> list[Any]:
    """A sender actor for each group of servers (:func:`split_servers`), on this (the driver's) node when it can.

    Ray restarts one that dies. Returns at once: the actors' processes start (a second of CPU each)
    and connect to their servers while the driver goes on — meeting the servers, reading the first
    texts; chunks sent meanwhile wait in the actor's queue. A sender that fails to start is found by
    the first chunk sent to it.
    """
    here = ray.get_runtime_context().get_node_id()
    options: dict[str, object] = {
        "num_cpus": 0, "max_restarts": MAX_SENDER_RESTARTS, "max_task_retries": 0, "max_concurrency": 1000,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=here, soft=True)}
    if crash_settings := task_environment():
        options["runtime_env"] = {"env_vars": crash_settings}
    actor_class = ray.remote(SenderActor).options(**options)  # type: ignore[arg-type]
    return [actor_class.remote(tuple(servers), api_key_env) for servers in groups]


def start_senders(plans: Sequence[SenderPlan], actors: Sequence[Any] | None = None) -> list[SenderRef]:
    """The senders of ``plans``: ``actors`` from :func:`launch_senders` (one per plan), or new ones."""
    if actors is None:
        actors = launch_senders([[p.endpoint for p in plan.servers] for plan in plans],
                                plans[0].api_key_env if plans else None)
    if len(actors) != len(plans):
        raise ValueError(f"{len(plans)} sender plans for {len(actors)} sender actors")
    for actor, plan in zip(actors, plans, strict=True):
        actor.prepare.remote(plan)
    return [SenderRef(actor, plan) for actor, plan in zip(actors, plans, strict=True)]


def stop_senders(actors: Sequence[Any], timeout: float = 10.0) -> dict[str, dict[str, object]]:
    """Per-server stats from every sender actor, then the actors killed (a dead one reports nothing)."""
    stats: dict[str, dict[str, object]] = {}
    refs: list[ray.ObjectRef[Any]] = [actor.stats.remote() for actor in actors]
    for ref in refs:
        try:
            stats.update(ray.get(ref, timeout=timeout))
        except (ray.exceptions.RayError, TimeoutError):
            continue
    for actor in actors:
        ray.kill(actor, no_restart=True)
    return stats


def sender_news(senders: Sequence[SenderRef], timeout: float = 2.0) -> list[str]:
    """What the senders have to say about faults since last asked (nothing from a busy or dead one)."""
    lines: list[str] = []
    refs: list[ray.ObjectRef[Any]] = [s.actor.news.remote() for s in senders]
    for ref in refs:
        try:
            lines += ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayError, TimeoutError):
            continue
    return lines


def last_streams(senders: Sequence[SenderRef], streams: Iterable[str]) -> None:
    """Tell every sender that only the shards ``streams`` may still send texts (it does not wait)."""
    names = sorted(streams)
    for sender in senders:
        sender.actor.last_streams.remote(names)


def streams_done(senders: Sequence[SenderRef], streams: Iterable[str]) -> None:
    """Tell every sender that the shards ``streams`` will send nothing more (it does not wait)."""
    for stream in streams:
        for sender in senders:
            sender.actor.stream_done.remote(stream)


class SenderFailed(TeibatchError):
    """A chunk could not be embedded because its sender kept dying; the shard is retried by a later run."""


def embed_through_senders(texts: Iterable[str], senders: Sequence[SenderRef], dimension: int,
                          priority: float = 0.0, stream: str | None = None,
                          head: HeadStart | None = None) -> EmbedResult:
    """Embed ``texts`` through ``senders`` and put the results together in order: :func:`embedded_in_order`, merged."""
    parts = list(embedded_in_order(texts, senders, priority=priority, stream=stream, head=head))
    return EmbedResult.assembled(sum(len(part.ok) for _, part in parts), dimension, parts)


def embedded_in_order(texts: Iterable[str], senders: Sequence[SenderRef], priority: float = 0.0,
                      stream: str | None = None, head: HeadStart | None = None,
                      ) -> Iterator[tuple[int, EmbedResult]]:
    """Embed ``texts`` in chunks over ``senders``; yield ``(start, result)`` per chunk, in text order (in a shard task).

    A chunk's result is yielded as soon as it and every chunk before it are back, so that the caller
    can write the leading vectors while the rest are embedded.

    ``texts`` is read lazily, one chunk at a time, only when a sender has room for it: the first chunk
    goes out as soon as it is read, while the rest of the shard is still being read and hashed.

    ``priority`` orders this task's chunks against other tasks' in each sender (lower first): the
    task's start time, so that the oldest task finishes first (see ``pipeline/admission.py``).

    Each sender gets at most twice its budget plus one chunk of this task's texts at a time, so that
    this task alone can keep every server full while the others read or write; new chunks go to the sender
    with the fewest of this task's inputs outstanding, so a faster sender gets more. A sender whose
    servers are all down (``CapacityUnavailable``) is left for this task while another sender lives.

    ``stream``: the shard's id, told to every sender once its last chunk is out (see :class:`Streams`).

    ``head``: chunks of the first texts that the driver already sent (``pipeline/head_start.py``);
    their results are taken as this task's when the first texts are those the driver read.
    """
    all_sent = _Once(lambda: streams_done(senders, [stream] if stream is not None else []))
    try:
        yield from _send_in_chunks(texts, senders, priority, all_sent, head)
    finally:
        all_sent()  # a shard that failed sends nothing more either


class _Once:
    """Calls its action the first time it is called, and never again."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


def _send_in_chunks(texts: Iterable[str], senders: Sequence[SenderRef], priority: float,
                    all_sent: Callable[[], None], head: HeadStart | None) -> Iterator[tuple[int, EmbedResult]]:
    """The work of :func:`embedded_in_order`; ``all_sent`` is called once the last chunk is out."""
    chunk_size = min(s.chunk_size for s in senders)
    source = iter(texts)
    count = 0  # texts read from ``source`` so far
    unsent: deque[tuple[int, list[str]]] = deque()  # chunks read, or to be sent again
    outstanding: dict[ray.ObjectRef, tuple[int, list[str], int]] = {}
    load = [0] * len(senders)
    if head is not None:
        first = list(islice(source, head.count))
        count = len(first)
        if count == head.count and texts_digest(first) == head.digest:
            for sent in head.chunks:
                outstanding[sent.result] = (sent.start, first[sent.start:sent.start + sent.length], sent.sender)
                load[sent.sender] += sent.length
        else:  # not the texts the driver read: these are sent like any others
            unsent.extend((start, first[start:start + chunk_size]) for start in range(0, count, chunk_size))
    alive = set(range(len(senders)))
    resends: dict[int, int] = {}
    back: dict[int, EmbedResult] = {}  # results that wait for an earlier chunk's
    given = 0  # texts whose results were yielded
    exhausted = False
    while True:
        while ready := [i for i in alive if load[i] < OUTSTANDING_BUDGETS * senders[i].budget + senders[i].chunk_size]:
            if not unsent and not exhausted:
                chunk = list(islice(source, chunk_size))
                exhausted = len(chunk) < chunk_size
                if chunk:
                    unsent.append((count, chunk))
                    count += len(chunk)
            if not unsent:
                break
            index = min(ready, key=lambda i: load[i] / senders[i].budget)
            start, chunk = unsent.popleft()
            outstanding[senders[index].actor.embed.remote(chunk, priority, senders[index].plan)] = (start, chunk, index)
            load[index] += len(chunk)
        if exhausted and not unsent:
            all_sent()
        if not outstanding:
            break
        done, _ = ray.wait(list(outstanding), num_returns=1, timeout=WAIT_SLICE_S)
        for ref in done:
            start, chunk, index = outstanding.pop(ref)
            load[index] -= len(chunk)
            try:
                result: EmbedResult = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, CapacityUnavailable) and len(alive) > 1:
                    alive.discard(index)
                    unsent.appendleft((start, chunk))
                    continue
                raise (cause if isinstance(cause, BaseException) else exc) from None
            except ray.exceptions.RayActorError as exc:
                resends[start] = resends.get(start, 0) + 1
                if resends[start] > MAX_CHUNK_RESENDS:
                    raise SenderFailed(f"a sender died {MAX_CHUNK_RESENDS + 1} times while embedding texts "
                                       f"{start}-{start + len(chunk)} of this shard ({exc.__class__.__name__}); "
                                       "the same command retries the shard") from None
                unsent.appendleft((start, chunk))
                continue
            back[start] = result
            while given in back:
                result = back.pop(given)
                yield given, result
                given += len(result.ok)

