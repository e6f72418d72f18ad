"""The sender as a Ray actor, and the driver's calls that start, ask and stop the senders.

:class:`SenderActor` hosts one :class:`~teibatch.pipeline.senders.core.SenderCore` in Ray: it takes
the sender's plan with every chunk, so a sender Ray restarts has it from its first one.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from teibatch.crashpoints import task_environment
from teibatch.endpoint import Endpoint
from teibatch.pipeline.landed import LandedDocuments
from teibatch.pipeline.senders.core import CONNECTIONS_AHEAD, SenderCore, ServerClients, Streams
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan
from teibatch.tei import EmbedResult, tls_context

MAX_SENDER_RESTARTS = 5


class SenderActor:
    """The Ray actor around a :class:`SenderCore` (async methods: chunks run concurrently).

    It is created with its servers' addresses, before anything else is known of them, and opens
    connections to them at once, while Ray readies it for its first call. Its plan comes with every
    chunk, so that a restarted actor (Ray calls ``__init__`` again) has it from the first chunk it is
    sent. A plan without a dimension (sent before the servers' probe) sets the sender up; chunks sent
    with one wait until a probed plan comes with another call.
    """

    def __init__(self, servers: Sequence[Endpoint] = (), api_key_env: str | None = None) -> None:
        self.core: SenderCore | None = None
        self.streams = Streams()
        self.clients = ServerClients()
        self.landed = LandedDocuments()
        self._https = any(server.url.startswith("https:") for server in servers)
        self._probed = asyncio.Event()
        self._connecting: asyncio.Task[None] | None = None
        if servers:
            with contextlib.suppress(RuntimeError):  # no event loop: built outside Ray, connects when called
                self._connecting = asyncio.get_running_loop().create_task(
                    self.clients.open(servers, CONNECTIONS_AHEAD, api_key_env))

    async def warm(self) -> None:
        """Finish the one-time set-up: :func:`~teibatch.tei.client.tls_context` (for HTTPS), the connections.

        Also moves every object alive now (Ray's, the imported modules', the connections') out of
        the garbage collector's sight: a full collection scanned them all, a pause in which no answer
        became a new request (measured in ``docs/client.md``, "The senders come first for the CPU").
        """
        if self._https:
            tls_context()
        if self._connecting is not None:
            await self._connecting
        gc.freeze()

    async def prepare(self, plan: SenderPlan) -> None:
        """Take ``plan`` and connect to its servers (once), while the servers are probed or the first tasks start."""
        await self._core(plan).connect()

    async def embed(self, texts: list[str], priority: float, plan: SenderPlan) -> EmbedResult:
        """Vectors for ``texts`` (sent once the sender has the probed plan)."""
        core = self._core(plan)
        if core.dimension is None:
            await self._probed.wait()
        return await core.embed(texts, priority)

    async def probed(self, plan: SenderPlan) -> None:
        """``plan`` now has the vector size the servers' probe showed: the chunks waiting for it go now."""
        self._core(plan)

    async def stream_done(self, stream: str) -> None:
        """Shard ``stream`` has sent its last chunk (see :class:`Streams`)."""
        self.streams.finished(stream)

    async def last_streams(self, streams: list[str]) -> None:
        """Only ``streams`` may still send chunks (see :class:`Streams`)."""
        self.streams.last_ones(streams)

    def _core(self, plan: SenderPlan) -> SenderCore:
        if self.core is None:
            self.core = SenderCore(plan, self.streams, self.clients)
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

    async def add_landed(self, shard: str, documents: int) -> None:
        """A shard task's documents that now have all their vectors, kept for the driver's progress
        (``pipeline/landed.py``: the run's first sender keeps them)."""
        self.landed.add_landed(shard, documents)

    async def take_landed(self) -> dict[str, int]:
        """The landed documents per shard since last taken (:meth:`add_landed`)."""
        return self.landed.take_landed()

    async def stats(self) -> dict[str, dict[str, object]]:
        return self.core.stats() if self.core is not None else {}

    async def news(self) -> list[str]:
        return self.core.news() if self.core is not None else []

    async def close(self) -> None:
        if self.core is not None:
            await self.core.close()


def launch_senders(groups: Sequence[Sequence[Endpoint]], api_key_env: str | None = None) -> list[Any]:
    """A sender actor for each group of servers (``plans.split_servers``), on this (the driver's) node when it can.

    Ray restarts one that dies. Returns at once: the actors' processes start and connect to their
    servers while the driver goes on — meeting the servers, reading the first texts; chunks sent
    meanwhile wait in the actor's queue. A sender that fails to start is found by the first chunk
    sent to it.
    """
    here = ray.get_runtime_context().get_node_id()
    options: dict[str, object] = {
        "num_cpus": 0, "max_restarts": MAX_SENDER_RESTARTS, "max_task_retries": 0, "max_concurrency": 1000,
        "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=here, soft=True)}
    if crash_settings := task_environment():
        options["runtime_env"] = {"env_vars": crash_settings}
    actor_class = ray.remote(SenderActor).options(**options)  # type: ignore[arg-type]
    return [actor_class.remote(tuple(servers), api_key_env) for servers in groups]


def start_senders(plans: Sequence[SenderPlan],
                  actors: Sequence[Any] | None = None) -> tuple[list[SenderRef], list[ray.ObjectRef[None]]]:
    """The senders of ``plans``: ``actors`` from :func:`launch_senders` (one per plan), or new ones; and
    for each sender the call that ends once it has its plan and has connected to its servers
    (``SenderActor.prepare``), to wait for."""
    if actors is None:
        actors = launch_senders([[p.endpoint for p in plan.servers] for plan in plans],
                                plans[0].api_key_env if plans else None)
    if len(actors) != len(plans):
        raise ValueError(f"{len(plans)} sender plans for {len(actors)} sender actors")
    prepared = [actor.prepare.remote(plan) for actor, plan in zip(actors, plans, strict=True)]
    return [SenderRef(actor, plan) for actor, plan in zip(actors, plans, strict=True)], prepared


def probed_senders(senders: Sequence[SenderRef], dimension: int) -> list[SenderRef]:
    """``senders`` (started with plans of no dimension yet) told the vector size the servers' probe showed."""
    probed = [SenderRef(sender.actor, replace(sender.plan, dimension=dimension)) for sender in senders]
    for sender in probed:
        sender.actor.probed.remote(sender.plan)
    return probed


def stop_senders(actors: Sequence[Any], timeout: float = 10.0) -> dict[str, dict[str, object]]:
    """Per-server stats from every sender actor, then the actors killed (a dead one reports nothing)."""
    stats: dict[str, dict[str, object]] = {}
    for answer in _answers([actor.stats.remote() for actor in actors], timeout):
        stats.update(answer)
    for actor in actors:
        ray.kill(actor, no_restart=True)
    return stats


def sender_news(senders: Sequence[SenderRef], timeout: float = 2.0) -> list[str]:
    """What the senders have to say about faults since last asked (nothing from a busy or dead one)."""
    return [line for answer in _answers([s.actor.news.remote() for s in senders], timeout) for line in answer]


def _answers(refs: list[ray.ObjectRef[Any]], timeout: float) -> Iterator[Any]:
    """The answer of each of ``refs`` in turn, each waited for at most ``timeout`` (none from a dead or busy actor)."""
    for ref in refs:
        try:
            yield ray.get(ref, timeout=timeout)
        except (ray.exceptions.RayError, TimeoutError):
            continue
