"""The first wave: the driver sends the run's first requests itself, until the senders are running.

A sender is a Ray actor: its process start (Ray's worker, importing numpy and httpx, Ray readying
the actor) is the longest step of the opening (docs/client.md), and the servers would wait for it.
The driver has everything loaded, and has just met the servers: right after the probe it sends
the head start's first texts (``pipeline/head_start.py``) itself, from a thread of its own,
keeping each server's whole in-flight budget busy — a request back is followed by the next —
until the senders say they are running. The servers are busy from the probe on.

The budget is never shared twice. Each sender's plan says how many inputs the driver may have in
flight at each of its servers (``SenderPlan.held``: the server's whole budget); they count against
the sender's window until the driver gives them back (``SenderActor.others_released``). Once the
senders are running (or the driver has sent every text it has), the driver sends nothing more: it
gives back at once what it does not use, and each request's inputs as it comes back. So the
driver's inputs in flight plus the sender's never exceed the server's ``max_concurrent_requests``.
The driver sends each text at most once: what fails (a 429, a dropped answer, a text too long) or
was not sent when it stopped is left to the senders, which embed whatever the driver did not get.
Each request back is counted in its server's sender's report (``SenderActor.others_landed``).

The vectors reach the shard task the way the head start's always did: the chunks of the wave's
texts are sent to the senders as ordinary head start chunks, marked with their wave key; the
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

from teibatch.pipeline.senders.core import ServerClients
from teibatch.pipeline.senders.plans import ServerPlan
from teibatch.tei import ROUTE_EMBED_SPARSE, EmbedOptions, EmbedRequest, EmbedResult, RequestPacker, TeiClient
from teibatch.tei.pool import ServerStats

log = logging.getLogger(__name__)

# Connections opened ahead to each server: those of the requests that make the servers' first batches.
# The other requests open theirs as they go, while those batches run.
CONNECTIONS_AHEAD = 4
# How long the run's end waits for the wave's thread (its requests have all landed by then, unless the
# run stopped early).
STOP_TIMEOUT_S = 5.0

Landed = Callable[[str, int, int, float, float, dict[str, int]], None]
"""Called once per server, when every request is back: server URL, requests answered, inputs in them,
their summed latency, when the first was sent (monotonic), failed requests by error."""
Released = Callable[[str, int], None]
"""Called when the driver gives back inputs of a server's budget: server URL, inputs."""
Deposit = Callable[[int, EmbedResult], None]
"""Called as each chunk is done: the chunk's wave key (its first text's position) and its vectors."""


@dataclass(frozen=True)
class WaveRequest:
    """One request of the wave: the texts at ``positions`` of chunk ``chunk``."""

    chunk: int
    positions: tuple[int, ...]
    request: EmbedRequest


@dataclass
class _Budget:
    """What the driver holds at one server, what it has out there, and what came back."""

    held: int
    max_requests: int
    in_flight: int = 0
    requests: int = 0
    tally: ServerStats = field(default_factory=ServerStats)  # what came back: requests and inputs used, errors

    def takes(self, count: int) -> bool:
        return self.in_flight + count <= self.held and self.requests < self.max_requests


@dataclass
class FirstWave:
    """The driver's first requests: planned from the first texts, sent from a thread of their own.

    ``chunks``: the texts of each chunk it covers (chunk ``i`` starts at text ``i * chunk_size``).
    """

    servers: tuple[ServerPlan, ...]
    chunk_size: int
    chunks: tuple[tuple[str, ...], ...]
    requests: tuple[WaveRequest, ...]
    _thread: threading.Thread | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _dimension: int | None = field(default=None, repr=False)
    _go: asyncio.Event | None = field(default=None, repr=False)
    _senders_running: Callable[[], bool] = field(default=lambda: False, repr=False)

    @property
    def keys(self) -> tuple[int, ...]:
        """The wave key of each chunk it covers: the chunk's first text's position."""
        return tuple(i * self.chunk_size for i in range(len(self.chunks)))

    @property
    def held(self) -> dict[str, int]:
        """Per server URL, the inputs the driver may have in flight there: its whole budget."""
        return {p.endpoint.url: p.limits.max_inflight_inputs for p in self.servers}

    def start(self, *, options: EmbedOptions, request_timeout: float, model_id: str | None,
              api_key_env: str | None, landed: Landed, released: Released, deposit: Deposit) -> None:
        """Open the connections of the first requests, from a thread, and send the requests once :meth:`go` is called.

        Opening a connection costs a millisecond or two of CPU; opened as the requests go, all of
        them are opened before the first request is written, and the servers wait that long. Those
        of the first requests, opened while the servers are met and probed, are ready when the
        probe's answer comes; the others are opened while the first batches run. The callbacks are
        called from the thread.
        """

        def run() -> None:
            try:
                asyncio.run(self._send_all(options, request_timeout, model_id, api_key_env, landed, released,
                                           deposit))
            except asyncio.CancelledError:  # stopped by :meth:`stop`: the run is ending
                pass
            except Exception:  # every chunk was deposited and every input given back in _Sending.run's finally
                log.exception("the driver's first requests stopped early")

        self._thread = threading.Thread(target=run, name="teibatch-first-wave", daemon=True)
        self._thread.start()

    def go(self, dimension: int) -> None:
        """The servers' probe showed their vector size: send now (as soon as the first connections are open)."""
        self._dimension = dimension
        loop, go = self._loop, self._go  # not there yet: the thread sees the dimension once it has connected
        if loop is not None and go is not None:
            with contextlib.suppress(RuntimeError):  # the thread ended meanwhile
                loop.call_soon_threadsafe(go.set)

    def watch(self, senders_running: Callable[[], bool]) -> None:
        """Send nothing more once ``senders_running()`` says so (called from the wave's thread: it must not block)."""
        self._senders_running = senders_running

    def senders_running(self) -> bool:
        """Whether the senders said they are running (see :meth:`watch`)."""
        return self._senders_running()

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Wait for the thread (at most ``timeout``); requests not sent or still out then are cancelled."""
        if self._thread is None:
            return
        if self._dimension is None:
            timeout = 0.0  # never told to go: nothing to wait for
        self._thread.join(timeout)
        loop = self._loop
        if self._thread.is_alive() and loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
                loop.call_soon_threadsafe(_cancel_all, loop)
            self._thread.join(STOP_TIMEOUT_S)

    async def _send_all(self, options: EmbedOptions, request_timeout: float, model_id: str | None,
                        api_key_env: str | None, landed: Landed, released: Released, deposit: Deposit) -> None:
        self._go = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        connections = ServerClients()
        clients = [TeiClient(plan.endpoint, connections.get(plan.endpoint.url), timeout=request_timeout,
                             model=model_id, api_key_env=api_key_env, normalized=options.normalize)
                   for plan in self.servers]
        try:
            # The connections of each server's first requests (see :meth:`start`).
            await connections.open((plan.endpoint for plan in self.servers),
                                   min(CONNECTIONS_AHEAD, max(plan.limits.max_requests for plan in self.servers)),
                                   api_key_env)
            if self._dimension is None:
                await self._go.wait()
            if self._dimension is not None:
                for client in clients:
                    client.expected_dimension = self._dimension
                await _Sending(self, clients, self._dimension, landed, released, deposit).run()
        finally:
            await connections.close()


class _Sending:
    """The wave's requests on their way: each server's budget kept full until the senders run, then given back."""

    def __init__(self, wave: FirstWave, clients: Sequence[TeiClient], dimension: int, landed: Landed,
                 released: Released, deposit: Deposit) -> None:
        self.wave, self.clients = wave, clients
        self.landed, self.released, self.deposit = landed, released, deposit
        self.budgets = [_Budget(p.limits.max_inflight_inputs, p.limits.max_requests) for p in wave.servers]
        self.waiting = deque(wave.requests)
        sparse = wave.requests[0].request.route == ROUTE_EMBED_SPARSE  # one route for the whole wave
        self.results = [EmbedResult.blank(len(texts), dimension, sparse) for texts in wave.chunks]
        self.open_requests = [0] * len(wave.chunks)  # waiting or on their way
        for wave_request in wave.requests:
            self.open_requests[wave_request.chunk] += 1
        self.sending = True
        self.tasks: set[asyncio.Task[None]] = set()
        self.done = asyncio.Event()

    async def run(self) -> None:
        try:
            for chunk, count in enumerate(self.open_requests):
                if not count:
                    self._deposit(chunk)  # nothing of it could be sent: the sender embeds it all
            self._dispatch()
            await self.done.wait()
        finally:
            # Whatever happened, every input is given back and every chunk answered.
            for task in list(self.tasks):
                task.cancel()
            self._stop_sending()
            for index, budget in enumerate(self.budgets):
                if budget.held:
                    self._release(index, budget.held)
            for chunk in range(len(self.wave.chunks)):
                self._deposit(chunk)
            for index, budget in enumerate(self.budgets):
                tally = budget.tally
                if tally.first_sent is not None:
                    self.landed(self.wave.servers[index].endpoint.url, tally.requests, tally.inputs, tally.seconds,
                                tally.first_sent, dict(tally.errors))

    def _dispatch(self) -> None:
        """Send what the budgets take, oldest first; stop once the senders run or nothing is left."""
        if self.sending and self.waiting and not self.wave.senders_running():
            while self.waiting:
                wave_request = self.waiting[0]
                fitting = [i for i, b in enumerate(self.budgets) if b.takes(wave_request.request.count)]
                if not fitting:
                    return  # the next request back makes room
                index = max(fitting, key=lambda i: self.budgets[i].held - self.budgets[i].in_flight)
                self.waiting.popleft()
                budget = self.budgets[index]
                budget.in_flight += wave_request.request.count
                budget.requests += 1
                task = asyncio.get_running_loop().create_task(self._send(index, wave_request))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
        self._stop_sending()

    def _stop_sending(self) -> None:
        """Send nothing more: give back every input not in flight, leave what was not sent to the senders."""
        if not self.sending:
            return
        self.sending = False
        for wave_request in self.waiting:
            self.open_requests[wave_request.chunk] -= 1
        self.waiting.clear()
        for index, budget in enumerate(self.budgets):
            self._release(index, budget.held - budget.in_flight)
        for chunk, count in enumerate(self.open_requests):
            if not count:
                self._deposit(chunk)
        self._check_done()

    async def _send(self, index: int, wave_request: WaveRequest) -> None:
        client, budget = self.clients[index], self.budgets[index]
        count = wave_request.request.count
        sent_at = time.monotonic()
        tally = budget.tally
        if tally.first_sent is None:
            tally.first_sent = sent_at
        try:
            got = await client.embed(wave_request.request)
        except Exception as exc:  # the senders embed these texts: nothing is lost, nothing retried here
            tally.count_error(type(exc).__name__)
        else:
            positions = list(wave_request.positions)
            self.results[wave_request.chunk].vectors[positions] = got
            self.results[wave_request.chunk].ok[positions] = True
            tally.requests += 1
            tally.inputs += count
            tally.seconds += time.monotonic() - sent_at
        budget.in_flight -= count
        budget.requests -= 1
        if not self.sending:
            self._release(index, count)
        self.open_requests[wave_request.chunk] -= 1
        if not self.open_requests[wave_request.chunk]:
            self._deposit(wave_request.chunk)
        self._dispatch()
        self._check_done()

    def _release(self, index: int, count: int) -> None:
        if count > 0:
            self.budgets[index].held -= count
            self.released(self.wave.servers[index].endpoint.url, count)

    def _deposit(self, chunk: int) -> None:
        if self.open_requests[chunk] >= 0:
            self.open_requests[chunk] = -1  # deposited: once only
            self.deposit(chunk * self.wave.chunk_size, self.results[chunk])

    def _check_done(self) -> None:
        if not self.sending and not any(b.in_flight for b in self.budgets):
            self.done.set()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def plan_first_wave(servers: Sequence[ServerPlan], route: str, options: EmbedOptions, texts: Sequence[str],
                    chunk_size: int) -> FirstWave | None:
    """The wave for the first ``texts``, in chunks of ``chunk_size``, packed into requests.

    Requests are packed for the smallest batch and payload limits among ``servers``; a text that the
    senders would set aside (empty, too long, not encodable) is left to them. ``None`` when there is
    nothing to send.
    """
    if not servers or not texts:
        return None
    chunks = tuple(tuple(texts[start:start + chunk_size]) for start in range(0, len(texts), chunk_size))
    packer = RequestPacker(route, options, max_batch_size=min(p.limits.max_batch_size for p in servers),
                           payload_limit=min(p.limits.payload_limit for p in servers))
    max_chars = min((p.limits.max_input_chars for p in servers if p.limits.max_input_chars is not None),
                    default=None)
    requests = [WaveRequest(index, batch.positions, batch.request)
                for index, chunk in enumerate(chunks)
                for batch in packer.pack([(position, text) for position, text in enumerate(chunk)
                                          if _sendable(text, packer, max_chars)])]
    if not requests:
        return None
    return FirstWave(tuple(servers), chunk_size, chunks, tuple(requests))


def _sendable(text: str, packer: RequestPacker, max_chars: int | None) -> bool:
    """Whether ``text`` goes as it is in a request (else the senders deal with it: cut, sent alone or rejected)."""
    if not text or (not packer.options.truncate and max_chars is not None and len(text) > max_chars):
        return False
    try:
        return packer.fits_alone(orjson.dumps(text))
    except orjson.JSONEncodeError:
        return False
