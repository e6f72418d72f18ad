"""What a sender is given, how servers are split between senders, and which sender takes a chunk next.

Plain records, with no Ray and no HTTP: the driver plans the senders, the senders' processes receive
their plan with every chunk, and the shard tasks size their chunks by it, so all three import this
module and nothing heavier.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from teibatch.endpoint import Endpoint
from teibatch.tei import ClientLimits, EmbedOptions

T = TypeVar("T")

SERVERS_PER_SENDER = 4
CHUNK_BATCHES = 8
# A chunk also holds this many times its sender's budget, as long as its float32 vectors fit in
# CHUNK_VECTOR_BYTES: each chunk costs a Ray call each way and objects in Ray's store, milliseconds of
# CPU over the shard task, the sender and Ray's daemons; at 256 texts a chunk that was a fifth of the
# client's CPU (docs/benchmarks.md).
CHUNK_BUDGETS = 8
CHUNK_VECTOR_BYTES = 16 * 2**20
# A shard's first chunk is CHUNK_BATCHES full requests, and each next one this many times the one
# before, up to the full size: the servers get a shard's first texts as soon as they are read.
CHUNK_GROWTH = 4


@dataclass(frozen=True)
class ServerPlan:
    """One server as its sender sees it: where, and the limits the job allows towards it."""

    endpoint: Endpoint
    limits: ClientLimits


@dataclass(frozen=True)
class SenderPlan:
    """What one sender needs: its servers (with their whole limits) and how to talk to them.

    ``dimension`` is ``None`` until the servers' probe has shown it: a sender given such a plan
    connects to its servers, and the chunks sent with it (the first shard task's) wait in the
    sender until it has the probed plan.
    """

    servers: tuple[ServerPlan, ...]
    route: str
    embed: EmbedOptions
    dimension: int | None
    model_id: str | None = None
    api_key_env: str | None = None
    request_timeout: float = 60.0
    max_retries: int = 6

    def with_server(self, server: ServerPlan) -> SenderPlan:
        """This plan with ``server`` (a replacement) added to its servers."""
        return replace(self, servers=(*self.servers, server))

    @property
    def budget(self) -> int:
        """Inputs this sender may keep in flight over all its servers."""
        return sum(p.limits.max_inflight_inputs for p in self.servers)

    @property
    def chunk_size(self) -> int:
        """Texts in one chunk: ``CHUNK_BUDGETS`` times the sender's budget, no more than fit
        ``CHUNK_VECTOR_BYTES`` of vectors once the dimension is known, and never less than
        ``CHUNK_BATCHES`` full requests to the largest batch among its servers."""
        size = CHUNK_BUDGETS * self.budget
        if self.dimension:
            size = min(size, CHUNK_VECTOR_BYTES // (4 * self.dimension))
        return max(size, self.first_chunk_size)

    @property
    def first_chunk_size(self) -> int:
        """Texts in a shard's first chunk: ``CHUNK_BATCHES`` full requests to the largest batch among its servers."""
        return CHUNK_BATCHES * max(p.limits.max_batch_size for p in self.servers)


def plan_senders(whole: SenderPlan) -> list[SenderPlan]:
    """``whole`` (the plan of every server of the run) split between senders (:func:`split_servers`)."""
    return [replace(whole, servers=tuple(own)) for own in split_servers(whole.servers)]


def split_servers(servers: Sequence[T]) -> list[Sequence[T]]:
    """``servers`` split between ``ceil(len / SERVERS_PER_SENDER)`` senders, round robin."""
    count = max(1, math.ceil(len(servers) / SERVERS_PER_SENDER))
    return [servers[i::count] for i in range(count)]


@dataclass(frozen=True)
class SenderRef:
    """A sender as the driver and shard tasks see it: the actor handle and the shape of its work."""

    actor: Any  # ray.actor.ActorHandle of pipeline.senders.actor.SenderActor
    plan: SenderPlan

    @property
    def budget(self) -> int:
        return self.plan.budget

    @property
    def chunk_size(self) -> int:
        return self.plan.chunk_size

    @property
    def first_chunk_size(self) -> int:
        return self.plan.first_chunk_size


def least_loaded(senders: Sequence[SenderRef], load: Sequence[int], among: Iterable[int] | None = None) -> int:
    """The index of the sender (of those in ``among``; every one by default) with the least ``load`` per
    input of its budget: where the next chunk goes.

    ``load[i]``: the texts a caller has sent to ``senders[i]`` and not had back. Measured against the
    budget so that a sender with more servers takes more; counted by the caller so that a sender that
    answers sooner is given more again sooner. Ties go to the first of them.
    """
    return min(range(len(senders)) if among is None else among, key=lambda i: load[i] / senders[i].budget)
