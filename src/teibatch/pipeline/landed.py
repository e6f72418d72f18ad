"""Documents whose vectors landed inside shards still running, for the progress bar and log.

A shard is counted done only when it commits; with one large shard that is the end of the run, so
the shard tasks also say, as vectors come back, how many of their documents have all theirs.
Each task sums what landed and tells the run's first sender at most every :data:`REPORT_INTERVAL_S`
seconds (a call it does not wait for), which keeps the sums in a :class:`LandedDocuments`; the driver
takes them when it wakes anyway, never waiting (:class:`LandedPoll`), and passes them to the reporters
as ``advance(0, documents, status="running")``. When the shard ends, its ``advance`` carries only the
documents not counted yet (``pipeline/progress.InShardProgress``).

Kept in a sender rather than an actor of their own: an actor's process costs about a second of CPU
to start and run, which a run's opening took from its senders and first task. A sender that Ray
restarts starts its sums again from nothing: the progress shown lags until those shards end, and
nothing else depends on it.
"""

from __future__ import annotations

import time
from typing import Any

import ray

REPORT_INTERVAL_S = 0.5
"""A shard task tells the driver what landed at most this often."""


class LandedDocuments:
    """The run's counts of landed documents per shard not yet taken by the driver; the first sender
    actor keeps them, and answers the calls of the same names (``SenderActor.add_landed``)."""

    def __init__(self) -> None:
        self._landed: dict[str, int] = {}

    def add_landed(self, shard: str, documents: int) -> None:
        """``documents`` more of ``shard``'s documents have all their vectors."""
        self._landed[shard] = self._landed.get(shard, 0) + documents

    def take_landed(self) -> dict[str, int]:
        """The counts since last taken, per shard."""
        landed, self._landed = self._landed, {}
        return landed


class LandedPoll:
    """The driver's side: :meth:`take` never waits; a call the actor has not answered yet stays pending and
    is read on a later :meth:`take`, so a slow or starting actor delays counts but never drops them (a call
    given up on would still empty the actor)."""

    def __init__(self, actor: Any) -> None:
        self._actor = actor
        self._pending: Any = None

    def take(self) -> dict[str, int]:
        """What landed per shard since last taken, if the actor has answered; else nothing for now.
        Nothing either from a lost actor (progress is no reason to stop a run)."""
        if self._actor is None:
            return {}
        if self._pending is None:
            self._pending = self._actor.take_landed.remote()
        ready, _ = ray.wait([self._pending], timeout=0)
        if not ready:
            return {}
        ref, self._pending = self._pending, None
        try:
            return dict(ray.get(ref))
        except ray.exceptions.RayError:
            self._actor = None
            return {}


class ShardLanded:
    """One shard task's side: ``to(n)`` as its first ``n`` documents have all their vectors; what grew is
    sent at most every :data:`REPORT_INTERVAL_S` seconds, so a vector costs an integer comparison."""

    def __init__(self, actor: Any, shard: str) -> None:
        self._actor, self._shard = actor, shard
        self._sent = self._now = 0
        self._due = time.monotonic() + REPORT_INTERVAL_S

    def to(self, documents: int) -> None:
        self._now = max(self._now, documents)
        if self._actor is None or self._now == self._sent or time.monotonic() < self._due:
            return
        self._actor.add_landed.remote(self._shard, self._now - self._sent)
        self._sent, self._due = self._now, time.monotonic() + REPORT_INTERVAL_S
