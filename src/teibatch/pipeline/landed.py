"""Documents whose vectors landed inside shards still running, for the progress bar and log.

A shard is counted done only when it commits; with one large shard that is the end of the run, so
the shard tasks also say, as vectors come back, how many of their documents have all theirs.
Each task sums what landed and tells a small actor at most every :data:`REPORT_INTERVAL_S`
seconds (a call it does not wait for); the driver takes the sums when it wakes anyway, never waiting
(:class:`LandedPoll`), and passes them to the reporters as ``advance(0, documents, status="running")``.
When the shard ends, its ``advance`` carries only the documents not counted yet (:class:`InShardProgress`).
"""

from __future__ import annotations

import time
from typing import Any

import ray

from teibatch.pipeline.progress import Reporter, SilentReporter

REPORT_INTERVAL_S = 0.5
"""A shard task tells the driver what landed at most this often."""
STATUS_RUNNING = "running"


class LandedDocuments:
    """The run's counts of landed documents per shard not yet taken by the driver (a Ray actor)."""

    def __init__(self) -> None:
        self._landed: dict[str, int] = {}

    def add(self, shard: str, documents: int) -> None:
        self._landed[shard] = self._landed.get(shard, 0) + documents

    def take(self) -> dict[str, int]:
        """The counts since last taken, per shard."""
        landed, self._landed = self._landed, {}
        return landed


def start_landed() -> Any:
    """The actor for one run (no CPU of its own: it only adds numbers)."""
    return ray.remote(num_cpus=0)(LandedDocuments).remote()


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
            self._pending = self._actor.take.remote()
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
        self._actor.add.remote(self._shard, self._now - self._sent)
        self._sent, self._due = self._now, time.monotonic() + REPORT_INTERVAL_S


class InShardProgress(SilentReporter):
    """Passes every event on to ``reporter``; documents landed inside running shards go as
    ``advance(0, n, shard=…, status="running")``, and a shard's final ``advance`` carries only what was
    not counted before, so the documents add up to the shards' sizes."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self._counted: dict[str, int] = {}
        self._sizes: dict[str, int] = {}

    def landed(self, counts: dict[str, int]) -> None:
        """Documents that landed per running shard since the last call (never more than its size: a
        task Ray ran again counts from its start again)."""
        for shard, documents in counts.items():
            if shard not in self._counted:
                continue
            documents = min(documents, self._sizes[shard] - self._counted[shard])
            if documents > 0:
                self._counted[shard] += documents
                self.reporter.advance(0, documents, shard=shard, status=STATUS_RUNNING)

    def started(self, shard: str, size: int) -> None:
        """``shard``'s task was started, for ``size`` documents: what lands from it counts."""
        self._counted.setdefault(shard, 0)
        self._sizes[shard] = size

    def bind(self, run_id: str) -> None:
        self.reporter.bind(run_id)

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self.reporter.message(text, event=event, **fields)

    def start(self, shards: int, documents: int) -> None:
        self.reporter.start(shards, documents)

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        counted = self._counted.pop(fields.get("shard", ""), 0)
        self.reporter.advance(shards, max(0, documents - counted), **fields)

    def stop(self) -> None:
        self.reporter.stop()

    def finish(self, report: dict[str, Any]) -> None:
        self.reporter.finish(report)
