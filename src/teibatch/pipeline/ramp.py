"""How many shard tasks run at once as a run starts: one alone first, then one per core, then more.

One shard task can fill every server on its own (``pipeline/run.py`` groups small shards until a
task holds the senders' whole budget); a second one is there so that the next shard is already
sending when the first one ends. The driver readies one worker process before it meets the
servers; a second task needs another, and starting a Ray worker process costs CPU. Started at
once, that CPU comes out of the senders' while the servers' queues are still empty, and the
servers wait (the first full batches come later, and the whole run ends that much later:
docs/client.md); started :data:`FIRST_TASK_ALONE_S` later, the servers' queues hold seconds of work and nothing
waits. On a cluster of several machines the first tasks start together: Ray spreads them over the
machines, whose new workers take nothing from the senders' cores.

After that, as many tasks as the machine has cores, and :data:`TASKS_ADDED_PER_FINISH` more each
time one finishes, up to the run's limit: Ray keeps a worker process per core, and starting all the
others at once would take the CPU the senders need.

Within a shard, :func:`growing_sizes` ramps the same way: its first chunk of texts and its first
dedup claim are small, so its first texts go out as soon as they are read, and the later ones are
large, so a long shard makes few Ray calls.
"""

from __future__ import annotations

from collections.abc import Iterator

FIRST_TASK_ALONE_S = 1.0
TASKS_ADDED_PER_FINISH = 2


class TaskRamp:
    """The number of shard tasks allowed to run at once, given the time (``time.monotonic`` seconds)."""

    def __init__(self, limit: int, cores: int, started: float, *, alone_s: float = FIRST_TASK_ALONE_S) -> None:
        self.limit = max(1, limit)
        self.allowed = 1
        self._after_alone = min(self.limit, max(1, cores))
        self._alone_until = started + alone_s
        self.tick(started)

    def tick(self, now: float) -> None:
        """Let the other tasks start once the first has run alone long enough."""
        if now >= self._alone_until:
            self.allowed = max(self.allowed, self._after_alone)

    def task_finished(self, now: float) -> None:
        """One more task may run, past the first one's time alone (before it, the freed worker takes the next)."""
        if now >= self._alone_until:
            self.allowed = min(self.limit, max(self.allowed, self._after_alone) + TASKS_ADDED_PER_FINISH)

    def seconds_to_change(self, now: float) -> float | None:
        """How long until :meth:`tick` raises the allowance; ``None`` when it will not."""
        return max(0.0, self._alone_until - now) if self.allowed < self._after_alone else None


def growing_sizes(first: int, factor: int, largest: int) -> Iterator[int]:
    """``first``, then each size ``factor`` times the one before, up to ``largest`` (never below ``first``)."""
    size = first
    while True:
        yield size
        size = max(first, min(size * factor, largest))
