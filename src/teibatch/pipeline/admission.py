"""Admission of chunks into a sender: a bounded number at once, the oldest shard's first.

A chunk holds its slot while it has texts not yet sent; once its last text is out it gives the slot
back (it calls the :class:`Once` that :meth:`OldestFirst.slot` gave it) and only waits for answers.
A chunk in its tail (its last requests in the servers' queues, a few texts waiting to be sent again
after a 429 or a 503) has nothing for a server that frees room, so holding the slot through the tail
left the servers without work while the next chunks waited: with injected faults, waits of 0.2-0.6 s
with every window emptying.

First come, first served would interleave the chunks of every shard task, so tasks progress in
lockstep and finish together — and then all read, hash and write at the same moment while the
servers wait for new chunks. Served oldest shard first, one task finishes early and writes while
the next ones' chunks, already queued, keep the servers full; the tasks finish one after another.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager


class Once:
    """Calls its action the first time it is called, and never again (a slot given back, a stream ended)."""

    def __init__(self, action: Callable[[], None]) -> None:
        self._action: Callable[[], None] | None = action

    def __call__(self) -> None:
        action, self._action = self._action, None
        if action is not None:
            action()


class OldestFirst:
    """At most ``slots`` holders at once; waiters are admitted lowest ``priority`` first, then in arrival order."""

    def __init__(self, slots: int) -> None:
        self._free = max(1, slots)
        self._waiting: list[tuple[float, int, asyncio.Future[None]]] = []
        self._arrivals = itertools.count()

    @property
    def waiting(self) -> int:
        """Waiters not yet admitted (cancelled ones excluded)."""
        return sum(not future.done() for _, _, future in self._waiting)

    @asynccontextmanager
    async def slot(self, priority: float) -> AsyncIterator[Once]:
        """Hold one slot for the block, or until the holder calls what it was given (it hands the slot to
        the next waiter then and goes on without it); ``priority``: lower goes first (a shard task's start time)."""
        await self._acquire(priority)
        give_back = Once(self._release)
        try:
            yield give_back
        finally:
            give_back()

    async def _acquire(self, priority: float) -> None:
        if self._free > 0 and not self.waiting:
            self._free -= 1
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiting, (priority, next(self._arrivals), future))
        try:
            await future
        except asyncio.CancelledError:
            if future.done() and not future.cancelled():
                self._release()  # the slot was handed over just as the waiter was cancelled: pass it on
            raise

    def _release(self) -> None:
        while self._waiting:
            _, _, future = heapq.heappop(self._waiting)
            if not future.done():
                future.set_result(None)  # the slot goes straight to the next waiter
                return
        self._free += 1
