"""Admission of chunks into a sender: a bounded number at once, the oldest shard's first.

First come, first served would interleave the chunks of every shard task, so tasks progress in
lockstep and finish together — and then all read, hash and write at the same moment while the
servers wait for new chunks. Served oldest shard first, one task finishes early and writes while
the next ones' chunks, already queued, keep the servers full; the tasks finish one after another.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


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
    async def slot(self, priority: float) -> AsyncIterator[None]:
        """Hold one slot for the block; ``priority``: lower goes first (a shard task's start time)."""
        await self._acquire(priority)
        try:
            yield
        finally:
            self._release()

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
