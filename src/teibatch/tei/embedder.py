"""Embedding a list of texts over a pool: packing per server, retries, splits, per-document failures.

Every text ends with a vector or a :class:`Failure`, and one bad text never takes its batch-mates
down. What each of TEI's answers leads to (docs/client.md has the same table):

========================== ==================================================================
answer                     what happens
========================== ==================================================================
200                        vectors stored at their texts' positions (through any split/retry)
429 overloaded             window halved, same texts resent after a jittered wait (nothing was
                           processed); more than ``MAX_OVERLOAD_RETRIES`` in a row: the error
                           propagates (the shard fails, a later run resumes it)
413 body too large         the server's payload limit is learned; split in halves; a text too
                           big alone is cut to fit (``truncate`` on) or rejected
422 too many inputs        split in halves (the server's batch limit is learned)
422 input too long         bisected until the text stands alone; then rejected, or resent alone
                           with ``truncate: true`` and flagged when ``on_too_long: truncate``
other 4xx                  bisected; the text alone is rejected (``request_refused``)
server taken back (lost)    called back at once and resent on another server, not counted as a try
5xx, 424 backend, no answer resent on another healthy server after a jittered, bounded wait;
200 with a wrong answer    after ``max_retries`` the request is split, and a text that still
(count, dimension, NaN...) fails alone ends as ``embed_failed`` — a *server* failure, never a
                           final reject: the caller leaves the shard uncommitted (see
                           :data:`~teibatch.tei.work.RETRYABLE_FAILURES`)
401, 424 not embedding     raised at once: every other request would fail the same way
========================== ==================================================================
"""

from __future__ import annotations

import asyncio
import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from teibatch.errors import (
    InputTooLong,
    PayloadTooLarge,
    ServerFault,
    TeiError,
    TeiOverloaded,
    TeiRequestError,
    TeiUnavailable,
    TooManyInputs,
)
from teibatch.sparse import vector_rows
from teibatch.tei.client import EmbedRequest
from teibatch.tei.decode import ROUTE_EMBED_SPARSE
from teibatch.tei.hedging import Flight
from teibatch.tei.packing import ON_TOO_LONG_TRUNCATE, RequestPacker
from teibatch.tei.pool import EndpointPool, Server
from teibatch.tei.work import (
    FAILURE_EMBED,
    FAILURE_REFUSED,
    FAILURE_TOO_LONG,
    Failure,
    Item,
    Unit,
    WorkQueue,
)

DEFAULT_MAX_RETRIES = 6
MAX_OVERLOAD_RETRIES = 50
MAX_RETRY_AFTER_S = 30.0
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 5.0


@dataclass(frozen=True)
class EmbedResult:
    """Vectors for the texts that succeeded (``ok`` marks them) and a failure for every other text.

    ``vectors`` is a (texts, dimension) float32 matrix, or for ``/embed_sparse`` one
    :class:`~teibatch.sparse.SparseVector` per text (:mod:`teibatch.sparse`).

    ``truncated`` marks texts whose vector is of a cut text, as far as the client knows: cut by the
    client to fit the payload limit, or resent with truncation after the server refused them as too
    long. (With ``truncate`` on, TEI also cuts texts over ``max_input_length`` tokens silently;
    those are not marked: TEI does not say which.)
    """

    vectors: np.ndarray
    ok: np.ndarray
    failures: list[Failure]
    truncated: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=bool))

    def __post_init__(self) -> None:
        if len(self.truncated) != len(self.ok):
            object.__setattr__(self, "truncated", np.zeros(len(self.ok), dtype=bool))

    @classmethod
    def blank(cls, count: int, dimension: int, sparse: bool) -> EmbedResult:
        """A result for ``count`` texts, none embedded yet: its arrays are filled in place, by position, as
        answers come back (``sparse``: one sparse row per text, else a ``dimension``-wide float32 matrix).

        The one place a result's arrays are made, so that every result has the same shapes and types.
        """
        return cls(vector_rows(count, dimension, sparse), np.zeros(count, dtype=bool), [],
                   np.zeros(count, dtype=bool))

    @classmethod
    def assembled(cls, count: int, dimension: int,
                  parts: Sequence[tuple[int | np.ndarray, EmbedResult]]) -> EmbedResult:
        """One result for ``count`` texts put together from results for some of them: the chunks of a
        shard, or the texts the driver embedded and those a sender embedded after it.

        Each part comes with where its texts go: the position of its first (a run of texts), or one
        position per text. A later part takes its texts' places from an earlier one, failures
        included; a text no part covers is neither embedded nor failed. Failures are renumbered to
        their positions in the whole, in position order.
        """
        whole = cls.blank(count, dimension, sparse=any(part.vectors.dtype == object for _, part in parts))
        failures: list[Failure] = []
        for at, part in parts:
            where = slice(at, at + len(part.ok)) if isinstance(at, int) else at
            whole.vectors[where], whole.ok[where], whole.truncated[where] = part.vectors, part.ok, part.truncated
            if failures or part.failures:
                positions = np.arange(count)[where]
                if failures:
                    covered = set(positions.tolist())
                    failures = [f for f in failures if f.position not in covered]
                failures += [Failure(int(positions[f.position]), f.reason, f.detail) for f in part.failures]
        failures.sort(key=lambda f: f.position)
        return cls(whole.vectors, whole.ok, failures, whole.truncated)


def backoff(attempt: int, base: float = _BACKOFF_BASE_S) -> float:
    """Full-jitter exponential backoff: a random wait in [0, min(_BACKOFF_CAP_S, base * 2**attempt)]."""
    return random.uniform(0.0, min(_BACKOFF_CAP_S, base * (2 ** min(attempt, 20))))


async def embed_texts(pool: EndpointPool, packer: RequestPacker, texts: Sequence[str], *,
                      dimension: int, max_retries: int = DEFAULT_MAX_RETRIES,
                      all_sent: Callable[[], None] | None = None) -> EmbedResult:
    """Embed ``texts`` over ``pool``; fatal errors (401, wrong model kind, no server left) propagate.

    ``dimension``: the vectors' size; for sparse vectors (``packer``'s route is ``/embed_sparse``), the
    vocabulary size. ``all_sent``: called once, as soon as every text has been sent (or rejected
    unsent) at least once; the call goes on until the answers are in, resending what failed.
    """
    return await _Run(pool, packer, texts, dimension, max_retries, all_sent).execute()


@dataclass(eq=False)
class _Flight(Flight):
    """A request of one :func:`embed_texts` call: the texts it carries and the unit they came back as."""

    unit: Unit | None = None
    items: list[Item] = field(default_factory=list)
    recalled: bool = False


class _Alarm:
    """What wakes a dispatcher: an ``asyncio.Event`` for one waiter, waited on with a timeout at the
    cost of a timer (``asyncio.wait_for`` makes a task each time, and a dispatcher waits once per answer)."""

    def __init__(self) -> None:
        self.rung = False
        self._waiter: asyncio.Future[None] | None = None

    def ring(self) -> None:
        self.rung = True
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    async def wait(self, timeout: float) -> None:
        """Until :meth:`ring` (at once if it rang since :attr:`rung` was cleared), or ``timeout`` seconds."""
        if self.rung:
            return
        loop = asyncio.get_running_loop()
        self._waiter = waiter = loop.create_future()
        timer = loop.call_later(timeout, _settle, waiter)
        try:
            await waiter
        finally:
            timer.cancel()
            self._waiter = None


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class _Run:
    """One call of :func:`embed_texts`: a dispatcher loop that starts requests while servers have room."""

    def __init__(self, pool: EndpointPool, packer: RequestPacker, texts: Sequence[str],
                 dimension: int, max_retries: int, all_sent: Callable[[], None] | None = None) -> None:
        self.pool = pool
        self.all_sent = all_sent
        self.packer = packer
        self.max_retries = max_retries
        self.dimension = dimension
        known = [s.limits.max_input_chars for s in pool.servers if s.limits.max_input_chars is not None]
        # A text is refused up front only when every server would refuse it.
        max_chars = max(known) if len(known) == len(pool.servers) else None
        self.queue = WorkQueue(texts, packer, payload_limit=min(packer.payload_limit, pool.smallest_payload_limit),
                               max_input_chars=max_chars)
        self.sparse = packer.route == ROUTE_EMBED_SPARSE
        self.result = EmbedResult.blank(len(texts), dimension, self.sparse)
        self.flights: dict[asyncio.Task[None], _Flight] = {}
        self.fatal: BaseException | None = None
        self.wake = _Alarm()

    async def execute(self) -> EmbedResult:
        self.pool.listeners.append(self._pool_changed)
        self.pool.unsent_work.append(self._has_unsent)
        finished = False
        try:
            await self._dispatch()
            finished = True
        finally:
            self.pool.listeners.remove(self._pool_changed)
            self.pool.unsent_work.remove(self._has_unsent)
            for task in self.flights:
                if finished:
                    self.pool.outrun(task)  # its twin answered; its own answer releases its budget
                else:
                    task.cancel()
            if not finished:
                await asyncio.gather(*self.flights, return_exceptions=True)
        return replace(self.result, failures=self._every_text_accounted())

    def _pool_changed(self, room: bool) -> None:
        # Room on a server matters only to a call with texts left to send. One whose texts are all
        # out waits for its own answers (each rings it, _finished), and a sender holds several such
        # calls at once (pipeline/admission.py): woken on every answer of every call, they cost a
        # run of 1M short documents about 2 CPU-s more (bench_cpu.py).
        if not room or not self.queue.empty():
            self.wake.ring()

    def _every_text_accounted(self) -> list[Failure]:
        """The failures, sorted, and one to send again for any text with neither a vector nor a failure.

        There should be none; if a fault in this module ever left one, its shard is not committed
        (a retryable failure) and the next run sends the text, where it would be lost from the output.
        """
        failures = list(self.queue.failures)
        unaccounted = ~self.result.ok
        unaccounted[[f.position for f in failures]] = False
        failures += [Failure(int(position), FAILURE_EMBED, "no answer came back for it, nor an error (a client "
                             "fault; the same command sends it again)") for position in np.flatnonzero(unaccounted)]
        return sorted(failures, key=lambda f: f.position)

    def _has_unsent(self) -> bool:
        return not self.queue.empty()

    async def _dispatch(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self.wake.rung = False
            if self.fatal is not None:
                raise self.fatal
            if self.queue.empty():
                all_sent, self.all_sent = self.all_sent, None
                if all_sent is not None:
                    all_sent()
                if all(flight.settled for flight in self.flights.values()):
                    return
            self.pool.check_alive()
            if self._start_one(loop.time()) or self.pool.hedge():
                # The request just started goes out before the next is packed: a server that is
                # waiting gets its first inputs at once, not after every request it has room for.
                await asyncio.sleep(0)
                continue
            timeout = self.pool.probe_interval
            due = self.queue.next_due()
            if due is not None:
                timeout = min(timeout, max(0.0, due - loop.time()))
            await self.wake.wait(timeout)

    def _start_one(self, now: float) -> bool:
        """Start one request if some work and some server with room meet; True if anything changed."""
        for unit in self.queue.candidates(now):
            want = len(unit.items) if unit is not None else self.queue.fresh_left
            server = self.pool.pick(want, avoid=unit.avoid if unit is not None else None)
            if server is None:
                continue
            room = min(server.room(), self.packer.max_batch_size)
            items = self.queue.take(unit, room, min(server.payload_limit, self.packer.payload_limit))
            if items:
                request = self.queue.packer_for(unit).request([i.encoded for i in items], sum(i.chars for i in items))
                flight = _Flight(server, request, self.pool.next_order(), unit=unit, items=items)
                flight.copy_to = functools.partial(self._send_copy, flight)
                self._send(flight)
            return True
        return False

    def _send(self, flight: _Flight) -> None:
        self.pool.reserve(flight.server, flight.request.count)
        self.pool.flights.add(flight)
        task = asyncio.get_running_loop().create_task(self._request(flight))
        self.flights[task] = flight
        flight.recall = functools.partial(self._recall, task, flight)
        task.add_done_callback(self._finished)

    def _recall(self, task: asyncio.Task[None], flight: _Flight) -> None:
        """``flight``'s server is gone: its texts go back to the queue now, and the request is cancelled.

        The texts are put back here, not where the request's coroutine meets the cancellation: a task
        cancelled before its first step never runs its body, and its texts would be lost.
        """
        if flight.landed or flight.recalled:
            return
        flight.recalled = True
        self._land(flight)
        if not (flight.settled or flight.twin_out):  # no other request may still answer for the texts
            unit = flight.unit or Unit(flight.items)  # a fresh text's first request: no tries yet
            self.queue.put(Unit(flight.items, unit.attempts, unit.overloads, None, asyncio.get_running_loop().time(),
                                unit.truncating), first=True)
        task.cancel()

    def _send_copy(self, original: _Flight, server: Server) -> None:
        """A copy of ``original`` to ``server`` (see ``tei/hedging.py``): the first of the two answers wins."""
        copy = _Flight(server, original.request, self.pool.next_order(), twin=original, is_copy=True,
                       unit=original.unit, items=original.items)
        original.twin = copy
        server.stats.copies += 1
        self._send(copy)

    def _finished(self, task: asyncio.Task[None]) -> None:
        flight = self.flights.pop(task, None)
        if flight is not None:
            # A task cancelled before its first step (the call failed just after sending it) never ran
            # its body: its inputs leave the server's budget here, or the pool would count them forever.
            self._land(flight)
        failed = not task.cancelled() and task.exception() is not None
        if failed and self.fatal is None and (flight is None or not flight.settled):
            self.fatal = task.exception()
        self.wake.ring()

    async def _request(self, flight: _Flight) -> None:
        server, items = flight.server, flight.items
        loop = asyncio.get_running_loop()
        sent_at = loop.time()
        try:
            try:
                vectors = await server.client.embed(flight.request)
            except asyncio.CancelledError:
                if not flight.recalled:
                    raise
                return  # _recall put the texts back
            expected = (len(items),) if self.sparse else (len(items), self.dimension)
            if vectors.shape != expected:
                raise ServerFault(f"answered vectors of shape {vectors.shape} for {len(items)} inputs, expected "
                                  f"{expected}", server=server.url, kind="wrong shape")
        except TeiError as exc:
            self._land(flight)
            if flight.recalled:
                return  # the answer came before the cancellation did; _recall put the texts back
            server.stats.count_error(type(exc).__name__)
            if flight.settled or flight.twin_out:
                # The texts are answered, or their twin may yet answer.
                self._note_fault(server, exc, sent_at, loop.time())
            else:
                self._handle(server, flight.unit, items, exc, flight.request, sent_at)
            return
        finally:
            self._land(flight)
        if flight.recalled:
            return
        self.pool.succeeded(server, len(items), sent_at=sent_at, now=loop.time(), used=not flight.settled)
        if flight.settled:
            return  # its twin answered first
        flight.answered = True
        if flight.is_copy:
            server.stats.copies_won += 1
        positions = np.fromiter((i.position for i in items), dtype=np.int64, count=len(items))
        self.result.vectors[positions] = vectors
        self.result.ok[positions] = True
        self.result.truncated[positions] = [i.truncated for i in items]

    def _land(self, flight: _Flight) -> None:
        """``flight`` is back (answered or not): its inputs leave its server's budget, once."""
        if not flight.landed:
            flight.landed = True
            self.pool.flights.discard(flight)
            self.pool.release(flight.server, flight.request.count)

    def _note_fault(self, server: Server, exc: TeiError, sent_at: float, now: float) -> None:
        """What a failed request says about its server (its window, its health), whatever becomes of its texts."""
        if isinstance(exc, TeiOverloaded):
            self.pool.overloaded(server, sent_at=sent_at, now=now)
        elif isinstance(exc, TeiUnavailable):
            self.pool.failed(server, exc)
        elif not isinstance(exc, (PayloadTooLarge, TooManyInputs, InputTooLong, TeiRequestError)):
            raise exc  # 401, wrong model kind: nothing else can succeed

    def _handle(self, server: Server, unit: Unit | None, items: list[Item], exc: TeiError,
                request: EmbedRequest, sent_at: float) -> None:
        now = asyncio.get_running_loop().time()
        self._note_fault(server, exc, sent_at, now)
        attempts = unit.attempts if unit is not None else 0
        overloads = unit.overloads if unit is not None else 0
        truncating = unit.truncating if unit is not None else False
        if isinstance(exc, TeiOverloaded):
            # Nothing was processed: wait and resend. Bounded, so a stuck server cannot loop forever.
            if overloads >= MAX_OVERLOAD_RETRIES:
                raise exc
            server.stats.retries += 1
            wait = min(exc.retry_after, MAX_RETRY_AFTER_S) if exc.retry_after is not None else backoff(overloads)
            self.queue.put(Unit(items, attempts, overloads + 1, None, now + wait, truncating))
        elif isinstance(exc, PayloadTooLarge):
            server.learn_payload_limit(len(request.body))
            # Alone, it comes back to the queue, which cuts it to the learned limit or rejects it.
            self._split(items, truncating, alone=Unit(items, attempts, 0, None, now, truncating))
        elif isinstance(exc, TooManyInputs):
            server.learn_batch_cap(len(items))
            self._split_or_fail(items, truncating, FAILURE_REFUSED, exc)
        elif isinstance(exc, InputTooLong):
            if len(items) == 1 and not truncating and self.packer.options.on_too_long == ON_TOO_LONG_TRUNCATE:
                items[0].truncated = True
                self.queue.put(Unit(items, truncating=True, due=now), first=True)
            else:
                self._split_or_fail(items, truncating, FAILURE_TOO_LONG, exc)
        elif isinstance(exc, TeiRequestError):
            self._split_or_fail(items, truncating, FAILURE_REFUSED, exc)
        else:  # TeiUnavailable: _note_fault raised every other kind
            if attempts >= self.max_retries:
                self._split_or_fail(items, truncating, FAILURE_EMBED, exc)
                return
            server.stats.retries += 1
            wait = backoff(attempts, base=2 * _BACKOFF_BASE_S)
            self.queue.put(Unit(items, attempts + 1, 0, server.url, now + wait, truncating))

    def _split_or_fail(self, items: list[Item], truncating: bool, reason: str, exc: TeiError) -> None:
        if len(items) > 1:
            self._split(items, truncating)
        else:
            self.queue.fail(items, reason, str(exc))

    def _split(self, items: list[Item], truncating: bool, alone: Unit | None = None) -> None:
        """Resend ``items`` as two halves, each on its own, with a fresh retry budget."""
        if len(items) == 1:
            if alone is not None:
                self.queue.put(alone, first=True)
            return
        middle = len(items) // 2
        for half in (items[middle:], items[:middle]):
            self.queue.put(Unit(list(half), truncating=truncating), first=True)
