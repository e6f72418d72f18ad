"""The head start's requests: the driver sends the run's first requests itself, until the senders are running.

A sender's process start is the longest step of the opening (``pipeline/opening.py``), and the
servers would wait for it. Right after the probe the driver sends the head start's texts
(``pipeline/head_start.py``) itself, from a thread of its own, keeping each server's whole
in-flight budget busy — a request back is followed by the next — until the senders say they are
running. It sends through the senders' own engine: a
:class:`~teibatch.pipeline.senders.core.SenderCore` of every server, whose pool picks the server
for each request and keeps its accounting and stats.

The budget is never shared twice. Each sender's plan says how many inputs the driver may have in
flight at each of its servers (``SenderPlan.held``: the server's whole budget); they count against
the sender's window until the driver gives them back (``SenderActor.others_released``). Once the
senders are running (or the driver has sent every text it has), the driver sends nothing more: it
gives back at once what it does not use, and each request's inputs as it comes back. So the
driver's inputs in flight plus the sender's never exceed the server's ``max_concurrent_requests``.
The driver sends each text at most once: what fails (a 429, a dropped answer, a text too long) or
was not sent when it stopped is left to the senders, which embed whatever the driver did not get.
Each request back is counted in its server's sender's report (``SenderActor.others_landed``).

The vectors reach the shard task the way the head start's always do: the chunks of these texts
are sent to the senders as ordinary head start chunks, marked with their key; the
sender waits for the driver's vectors for that chunk (``SenderActor.deposit``, sent as soon as
nothing more of the chunk will come back), embeds the texts the driver did not get, and answers
the chunk. A restarted sender waits for nothing from the driver and embeds such a chunk itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import orjson

from teibatch.pipeline.senders.core import SenderCore
from teibatch.pipeline.senders.plans import SenderPlan, ServerPlan
from teibatch.tei import ROUTE_EMBED_SPARSE, EmbedRequest, EmbedResult, EndpointPool, RequestPacker, Server
from teibatch.tei.pool import ServerStats

log = logging.getLogger(__name__)

# Connections opened ahead to each server: those of the requests that make the servers' first batches.
# The other requests open theirs as they go, while those batches run.
CONNECTIONS_AHEAD = 4
# How long the run's end waits for the driver's thread (its requests have all landed by then, unless the
# run stopped early).
STOP_TIMEOUT_S = 5.0

Landed = Callable[[str, ServerStats], None]
"""Called once per server, when every request is back: server URL, and what the requests did there."""
Released = Callable[[str, int], None]
"""Called when the driver gives back inputs of a server's budget: server URL, inputs."""
Deposit = Callable[[int, EmbedResult], None]
"""Called as each chunk is done: the chunk's key (its first text's position) and its vectors."""


@dataclass(frozen=True)
class PlannedRequest:
    """One of the driver's requests: the texts at ``positions`` of chunk ``chunk``."""

    chunk: int
    positions: tuple[int, ...]
    request: EmbedRequest


@dataclass
class HeadStartRequests:
    """The driver's first requests: planned from the head start's first texts, sent from a thread of their own.

    ``chunks``: the texts of each chunk it covers (chunk ``i`` starts at text ``i * chunk_size``).
    """

    servers: tuple[ServerPlan, ...]
    chunk_size: int
    chunks: tuple[tuple[str, ...], ...]
    planned: tuple[PlannedRequest, ...]
    _thread: threading.Thread | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _dimension: int | None = field(default=None, repr=False)
    _go: asyncio.Event | None = field(default=None, repr=False)
    _senders_running: Callable[[], bool] = field(default=lambda: False, repr=False)

    @property
    def keys(self) -> tuple[int, ...]:
        """The key of each chunk it covers: the chunk's first text's position."""
        return tuple(i * self.chunk_size for i in range(len(self.chunks)))

    @property
    def held(self) -> dict[str, int]:
        """Per server URL, the inputs the driver may have in flight there: its whole budget."""
        return {p.endpoint.url: p.limits.max_inflight_inputs for p in self.servers}

    def start(self, plan: SenderPlan, *, landed: Landed, released: Released, deposit: Deposit) -> None:
        """Open the connections of the first requests, from a thread, and send the requests once :meth:`go` is called.

        ``plan``: every server of the run, with no dimension yet. Opening a connection costs a
        millisecond or two of CPU; opened as the requests go, all of them are opened before the first
        request is written, and the servers wait that long. Those of the first requests, opened while
        the servers are met and probed, are ready when the probe's answer comes; the others are
        opened while the first batches run. The callbacks are called from the thread.
        """

        def run() -> None:
            try:
                asyncio.run(self._send_all(plan, landed, released, deposit))
            except asyncio.CancelledError:  # stopped by :meth:`stop`: the run is ending
                pass
            except Exception:  # every chunk was deposited and every input given back in _Sending.run's finally
                log.exception("the driver's first requests stopped early")

        self._thread = threading.Thread(target=run, name="teibatch-head-start", daemon=True)
        self._thread.start()

    def go(self, dimension: int, senders_running: Callable[[], bool]) -> None:
        """The servers' probe showed their vector size: send now (as soon as the first connections are open),
        until ``senders_running()`` says they are (called from the driver's thread: it must not block)."""
        self._dimension, self._senders_running = dimension, senders_running
        loop, go = self._loop, self._go  # not there yet: the thread sees the dimension once it has connected
        if loop is not None and go is not None:
            with contextlib.suppress(RuntimeError):  # the thread ended meanwhile
                loop.call_soon_threadsafe(go.set)

    def stop(self) -> None:
        """Wait for the thread (at most :data:`STOP_TIMEOUT_S`); requests not sent or still out then are cancelled."""
        if self._thread is None:
            return
        self._thread.join(0.0 if self._dimension is None else STOP_TIMEOUT_S)  # never told to go: nothing to wait for
        loop = self._loop
        if self._thread.is_alive() and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_cancel_all, loop)
            self._thread.join(STOP_TIMEOUT_S)

    async def _send_all(self, plan: SenderPlan, landed: Landed, released: Released, deposit: Deposit) -> None:
        self._go = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        core = SenderCore(plan)  # the senders' own pool of the servers: their accounting, stats and choice
        try:
            # The connections of each server's first requests (see :meth:`start`).
            await core.clients.open((p.endpoint for p in plan.servers),
                                    min(CONNECTIONS_AHEAD, max(p.limits.max_requests for p in plan.servers)),
                                    plan.api_key_env)
            if self._dimension is None:
                await self._go.wait()
            if self._dimension is not None:
                core.probed(self._dimension)
                await _Sending(self, core.pool, self._dimension, landed, released, deposit).run()
        finally:
            await core.close()


class _Sending:
    """The driver's requests on their way through the driver's own :class:`EndpointPool` of the servers:
    each server's budget kept full until the senders run, then given back.

    The pool picks the server and keeps the accounting and the stats, as the senders' pools do; what
    is their own is that each request goes once (a failure is left to the senders, not retried)
    and that the driver holds each server's budget only until it stops (``held``, given back to the
    server's sender as :data:`Released`).
    """

    def __init__(self, head: HeadStartRequests, pool: EndpointPool, dimension: int, landed: Landed,
                 released: Released, deposit: Deposit) -> None:
        self.head, self.pool = head, pool
        self.landed, self.released, self.deposit = landed, released, deposit
        self.held = {server.url: server.limits.max_inflight_inputs for server in pool.servers}
        self.waiting = deque(head.planned)
        sparse = head.planned[0].request.route == ROUTE_EMBED_SPARSE  # one route for them all
        self.results = [EmbedResult.blank(len(texts), dimension, sparse) for texts in head.chunks]
        self.open_requests = [0] * len(head.chunks)  # waiting or on their way
        for item in head.planned:
            self.open_requests[item.chunk] += 1
        self.sending = True
        self.tasks: set[asyncio.Task[None]] = set()
        self.done = asyncio.Event()

    async def run(self) -> None:
        try:
            self._deposit_closed()  # a chunk nothing of which could be sent: the sender embeds it all
            self._dispatch()
            await self.done.wait()
        finally:
            # Whatever happened, every input is given back and every chunk answered.
            for task in list(self.tasks):
                task.cancel()
            self._stop_sending()
            for server in self.pool.servers:
                self._release(server, self.held[server.url])
            for chunk in range(len(self.head.chunks)):
                self._deposit(chunk)
            for server in self.pool.servers:
                if server.stats.first_sent is not None:
                    self.landed(server.url, server.stats)

    def _dispatch(self) -> None:
        """Send what the servers take, oldest first; stop once the senders run or nothing is left."""
        if self.sending and self.waiting and not self.head._senders_running():
            while self.waiting:
                item = self.waiting[0]
                server = self.pool.pick(item.request.count)
                if server is None:
                    return  # the next request back makes room
                self.waiting.popleft()
                self.pool.reserve(server, item.request.count)
                task = asyncio.get_running_loop().create_task(self._send(server, item))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        self._stop_sending()

    def _stop_sending(self) -> None:
        """Send nothing more: give back every input not in flight, leave what was not sent to the senders."""
        if not self.sending:
            return
        self.sending = False
        for item in self.waiting:
            self.open_requests[item.chunk] -= 1
        self.waiting.clear()
        for server in self.pool.servers:
            self._release(server, self.held[server.url] - server.in_flight)
        self._deposit_closed()
        self._check_done()

    async def _send(self, server: Server, item: PlannedRequest) -> None:
        count = item.request.count
        sent_at = time.monotonic()
        try:
            got = await server.client.embed(item.request)
        except Exception as exc:  # the senders embed these texts: nothing is lost, nothing retried here
            server.stats.count_error(type(exc).__name__)
        else:
            positions = list(item.positions)
            self.results[item.chunk].vectors[positions] = got
            self.results[item.chunk].ok[positions] = True
            self.pool.succeeded(server, count, sent_at=sent_at, now=time.monotonic())
        self.pool.release(server, count)
        if not self.sending:
            self._release(server, count)
        self.open_requests[item.chunk] -= 1
        if not self.open_requests[item.chunk]:
            self._deposit(item.chunk)
        self._dispatch()
        self._check_done()

    def _release(self, server: Server, count: int) -> None:
        """Give ``count`` inputs of what the driver holds at ``server`` back to its sender."""
        if count > 0:
            self.held[server.url] -= count
            self.released(server.url, count)

    def _deposit(self, chunk: int) -> None:
        if self.open_requests[chunk] >= 0:
            self.open_requests[chunk] = -1  # deposited: once only
            self.deposit(chunk * self.head.chunk_size, self.results[chunk])

    def _deposit_closed(self) -> None:
        """Deposit each chunk that has no request waiting or on its way (and was not deposited yet)."""
        for chunk, count in enumerate(self.open_requests):
            if not count:
                self._deposit(chunk)

    def _check_done(self) -> None:
        if not self.sending and not any(server.in_flight for server in self.pool.servers):
            self.done.set()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def plan_head_start_requests(plan: SenderPlan, texts: Sequence[str], chunk_size: int) -> HeadStartRequests | None:
    """The driver's requests for the first ``texts`` (in chunks of ``chunk_size``) to ``plan``'s servers.

    Requests are packed for the smallest batch and payload limits among the servers; a text that the
    senders would set aside (empty, too long, not encodable) is left to them. ``None`` when there is
    nothing to send.
    """
    servers = plan.servers
    if not servers or not texts:
        return None
    chunks = tuple(tuple(texts[start:start + chunk_size]) for start in range(0, len(texts), chunk_size))
    packer = RequestPacker(plan.route, plan.embed, max_batch_size=min(p.limits.max_batch_size for p in servers),
                           payload_limit=min(p.limits.payload_limit for p in servers))
    max_chars = min((p.limits.max_input_chars for p in servers if p.limits.max_input_chars is not None),
                    default=None)
    requests = [PlannedRequest(index, batch.positions, batch.request)
                for index, chunk in enumerate(chunks)
                for batch in packer.pack([(position, text) for position, text in enumerate(chunk)
                                          if _sendable(text, packer, max_chars)])]
    if not requests:
        return None
    return HeadStartRequests(servers, chunk_size, chunks, tuple(requests))


def _sendable(text: str, packer: RequestPacker, max_chars: int | None) -> bool:
    """Whether ``text`` goes as it is in a request (else the senders deal with it: cut, sent alone or rejected)."""
    if not text or (not packer.options.truncate and max_chars is not None and len(text) > max_chars):
        return False
    try:
        return packer.fits_alone(orjson.dumps(text))
    except orjson.JSONEncodeError:
        return False
