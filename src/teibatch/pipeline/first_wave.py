"""The first wave: the driver sends the run's first requests itself, while the senders' processes start.

A sender is a Ray actor: its process takes 0.4-0.5 s to start (Ray's worker, importing numpy and
httpx, Ray readying the actor) and the servers would wait for it. The driver has everything
loaded, and has just met the servers: right after the probe it sends the first texts of the head
start (``pipeline/head_start.py``) itself, one full window per server, from a thread of its own,
while the senders start. The servers are busy from the probe on.

The budget is never shared twice. The wave is planned before the senders get their plans: which
texts go in which request, and which request to which server, each server getting at most its
in-flight budget in inputs and in requests. Each sender's plan says how many inputs the wave
holds at each of its servers (``SenderPlan.held``); they count against the sender's window until
the driver says the request is back (``SenderActor.others_landed``), so that the driver's inputs
in flight plus the sender's never exceed the server's ``max_concurrent_requests``. The driver
sends each of its requests once, and never more than planned: what fails (a 429, a dropped
answer, a text too long) is left to the senders, which embed whatever the driver did not get.

The vectors reach the shard task the way the head start's always did: the chunks of the wave's
texts are sent to the senders as ordinary head start chunks, marked with their wave key; the
sender waits for the driver's vectors for that chunk (``SenderActor.deposit``), embeds the texts
the driver did not get, and answers the chunk. A restarted sender waits for nothing from the
driver and embeds such a chunk itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import httpx
import numpy as np
import orjson

from teibatch.pipeline.senders import CONNECT_TIMEOUT_S, ServerPlan
from teibatch.tei import EmbedOptions, EmbedRequest, EmbedResult, RequestPacker, TeiClient, tls_settings

log = logging.getLogger(__name__)

# Connections opened ahead to each server: those of the requests that make the servers' first batches.
# The other requests open theirs as they go, while those batches run.
CONNECTIONS_AHEAD = 4
# How long the run's end waits for the wave's thread (its requests have all landed by then, unless the
# run stopped early).
STOP_TIMEOUT_S = 5.0

Landed = Callable[[str, int, float, bool, "str | None"], None]
"""Called as each request is back: server URL, inputs, when it was sent (monotonic), whether its
vectors were kept, the name of its error (or None)."""
Deposit = Callable[[int, EmbedResult], None]
"""Called as each chunk is done: the chunk's wave key (its first text's position) and its vectors."""


@dataclass(frozen=True)
class WaveRequest:
    """One request of the wave: the texts at ``positions`` of chunk ``chunk``, to server ``server``."""

    server: int
    chunk: int
    positions: tuple[int, ...]
    request: EmbedRequest


@dataclass
class FirstWave:
    """The driver's first requests: planned from the first texts, then sent once from a thread of their own.

    ``chunks``: the texts of each chunk it covers (chunk ``i`` starts at text ``i * chunk_size``);
    ``held``: per server URL, the inputs it may have in flight there.
    """

    servers: tuple[ServerPlan, ...]
    chunk_size: int
    chunks: tuple[tuple[str, ...], ...]
    requests: tuple[WaveRequest, ...]
    held: dict[str, int]
    _thread: threading.Thread | None = field(default=None, repr=False)
    _loop: asyncio.AbstractEventLoop | None = field(default=None, repr=False)
    _dimension: int | None = field(default=None, repr=False)
    _go: asyncio.Event | None = field(default=None, repr=False)

    @property
    def keys(self) -> tuple[int, ...]:
        """The wave key of each chunk it covers: the chunk's first text's position."""
        return tuple(i * self.chunk_size for i in range(len(self.chunks)))

    def start(self, *, options: EmbedOptions, request_timeout: float, model_id: str | None,
              api_key_env: str | None, landed: Landed, deposit: Deposit) -> None:
        """Open the connections of the first requests, from a thread, and send every request once :meth:`go` is called.

        Opening a connection costs a millisecond or two of CPU; opened as the requests go, all of
        them are opened before the first request is written, and the servers wait that long. Those
        of the first requests, opened while the servers are met and probed, are ready when the
        probe's answer comes; the others are opened while the first batches run. ``landed`` and
        ``deposit`` are called from the thread.
        """

        def run() -> None:
            try:
                asyncio.run(self._send_all(options, request_timeout, model_id, api_key_env, landed, deposit))
            except Exception:  # every chunk was deposited in _send_all's finally; the senders do the rest
                log.exception("the driver's first requests stopped early")

        self._thread = threading.Thread(target=run, name="teibatch-first-wave", daemon=True)
        self._thread.start()

    def go(self, dimension: int) -> None:
        """The servers' probe showed their vector size: send the requests now (as soon as they are connected)."""
        self._dimension = dimension
        loop, go = self._loop, self._go  # not there yet: the thread sees the dimension once it has connected
        if loop is not None and go is not None:
            with contextlib.suppress(RuntimeError):  # the thread ended meanwhile
                loop.call_soon_threadsafe(go.set)

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
                        api_key_env: str | None, landed: Landed, deposit: Deposit) -> None:
        self._go = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        http = [_http_client(plan.endpoint.url) for plan in self.servers]
        clients = [TeiClient(plan.endpoint, http_client, timeout=request_timeout, model=model_id,
                             api_key_env=api_key_env, normalized=options.normalize)
                   for plan, http_client in zip(self.servers, http, strict=True)]
        try:
            await self._open(clients)
            if self._dimension is None:
                await self._go.wait()
            if self._dimension is not None:
                for client in clients:
                    client.expected_dimension = self._dimension
                await self._send(clients, self._dimension, landed, deposit)
        finally:
            for http_client in http:
                await http_client.aclose()

    async def _open(self, clients: Sequence[TeiClient]) -> None:
        """The connections of each server's first :data:`CONNECTIONS_AHEAD` requests (``/info``, which TEI
        answers without queueing it behind a batch).

        Best effort: a connection that fails to open is opened by its request (or fails it).
        """
        per_server = Counter(r.server for r in self.requests)
        await asyncio.gather(*(client.info(timeout=CONNECT_TIMEOUT_S) for index, client in enumerate(clients)
                               for _ in range(min(CONNECTIONS_AHEAD, per_server[index]))),
                             return_exceptions=True)

    async def _send(self, clients: Sequence[TeiClient], dimension: int, landed: Landed, deposit: Deposit) -> None:
        vectors = [np.zeros((len(texts), dimension), dtype=np.float32) for texts in self.chunks]
        ok = [np.zeros(len(texts), dtype=bool) for texts in self.chunks]
        left = [0] * len(self.chunks)
        for wave_request in self.requests:
            left[wave_request.chunk] += 1
        deposited: set[int] = set()

        def deposit_once(chunk: int) -> None:
            if chunk not in deposited:
                deposited.add(chunk)
                result = EmbedResult(vectors[chunk], ok[chunk], [], np.zeros(len(ok[chunk]), dtype=bool))
                deposit(chunk * self.chunk_size, result)

        async def send(client: TeiClient, wave_request: WaveRequest) -> None:
            sent_at = time.monotonic()
            error: str | None = None
            try:
                got = await client.embed(wave_request.request)
            except Exception as exc:  # the senders embed these texts: nothing is lost, nothing retried here
                error = type(exc).__name__
            else:
                positions = list(wave_request.positions)
                vectors[wave_request.chunk][positions] = got
                ok[wave_request.chunk][positions] = True
            landed(client.url, wave_request.request.count, sent_at, error is None, error)
            left[wave_request.chunk] -= 1
            if not left[wave_request.chunk]:
                deposit_once(wave_request.chunk)

        try:
            for chunk, count in enumerate(left):
                if not count:
                    deposit_once(chunk)  # nothing of it fitted the wave: the sender embeds it all
            await asyncio.gather(*(send(clients[r.server], r) for r in self.requests))
        finally:
            # Whatever happened, every chunk is answered: the senders complete what is missing.
            for chunk in range(len(self.chunks)):
                deposit_once(chunk)


def _http_client(url: str) -> httpx.AsyncClient:
    """A client with no cap on connections: the wave's plan bounds its requests."""
    return httpx.AsyncClient(verify=tls_settings(url), limits=httpx.Limits(max_connections=None,
                                                                           max_keepalive_connections=None))


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    for task in asyncio.all_tasks(loop):
        task.cancel()


def plan_first_wave(servers: Sequence[ServerPlan], route: str, options: EmbedOptions, texts: Sequence[str],
                    chunk_size: int) -> FirstWave | None:
    """The wave for the first ``texts``: whole chunks, as many as the servers' budgets hold (at least one).

    Requests are packed for the smallest batch and payload limits among ``servers`` and go, in order,
    to the server with the most budget left that takes them (inputs and requests in flight); a text
    that the senders would set aside (empty, too long, not encodable) and a request that no server
    has room for are left to the senders. ``None`` when there is nothing to send.
    """
    if not servers or not texts:
        return None
    budget = sum(p.limits.max_inflight_inputs for p in servers)
    count = max(1, budget // chunk_size)
    chunks = tuple(tuple(texts[start:start + chunk_size])
                   for start in range(0, min(len(texts), count * chunk_size), chunk_size))
    packer = RequestPacker(route, options, max_batch_size=min(p.limits.max_batch_size for p in servers),
                           payload_limit=min(p.limits.payload_limit for p in servers))
    max_chars = min((p.limits.max_input_chars for p in servers if p.limits.max_input_chars is not None),
                    default=None)
    inputs_left = [p.limits.max_inflight_inputs for p in servers]
    requests_left = [p.limits.max_requests for p in servers]
    requests: list[WaveRequest] = []
    for index, chunk in enumerate(chunks):
        sendable = [(position, text) for position, text in enumerate(chunk) if _sendable(text, packer, max_chars)]
        for batch in packer.pack(sendable):
            size = batch.request.count
            fitting = [i for i in range(len(servers)) if inputs_left[i] >= size and requests_left[i] > 0]
            if not fitting:
                continue
            server = max(fitting, key=lambda i: inputs_left[i])
            inputs_left[server] -= size
            requests_left[server] -= 1
            requests.append(WaveRequest(server, index, batch.positions, batch.request))
    if not requests:
        return None
    held = {p.endpoint.url: 0 for p in servers}
    for wave_request in requests:
        held[servers[wave_request.server].endpoint.url] += wave_request.request.count
    return FirstWave(tuple(servers), chunk_size, chunks, tuple(requests), held)


def _sendable(text: str, packer: RequestPacker, max_chars: int | None) -> bool:
    """Whether ``text`` goes as it is in a request (else the senders deal with it: cut, sent alone or rejected)."""
    if not text or (not packer.options.truncate and max_chars is not None and len(text) > max_chars):
        return False
    try:
        return packer.fits_alone(orjson.dumps(text))
    except orjson.JSONEncodeError:
        return False
