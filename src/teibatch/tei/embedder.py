"""Embedding a list of texts over a pool: packing, splitting, retries, and per-document failures.

Every text ends with a vector or a :class:`Failure`; one bad text never takes its batch-mates down:
a request refused for its content is split in halves until the offender stands alone.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import orjson

from teibatch.errors import (
    InputTooLong,
    PayloadTooLarge,
    TeiError,
    TeiOverloaded,
    TeiRequestError,
    TeiUnavailable,
    TooManyInputs,
)
from teibatch.tei.packing import Batch, RequestPacker
from teibatch.tei.pool import EndpointPool, Server

FAILURE_TOO_LONG = "input_too_long"
FAILURE_PAYLOAD = "payload_too_large"
FAILURE_REFUSED = "request_refused"
FAILURE_EMBED = "embed_failed"

DEFAULT_MAX_RETRIES = 6
MAX_OVERLOAD_RETRIES = 200
_BACKOFF_BASE_S = 0.05
_BACKOFF_CAP_S = 5.0


@dataclass(frozen=True)
class Failure:
    """The text at ``position`` could not be embedded; ``reason`` is a short code."""

    position: int
    reason: str
    detail: str


@dataclass
class EmbedResult:
    """Vectors for the texts that succeeded (``ok`` marks them) and a failure for every other text."""

    vectors: np.ndarray
    ok: np.ndarray
    failures: list[Failure]


def backoff(attempt: int, base: float = _BACKOFF_BASE_S, cap: float = _BACKOFF_CAP_S) -> float:
    """Full-jitter exponential backoff: a random wait in [0, min(cap, base * 2**attempt)]."""
    return random.uniform(0.0, min(cap, base * (2 ** min(attempt, 20))))


async def embed_texts(pool: EndpointPool, packer: RequestPacker, texts: Sequence[str], *,
                      dimension: int, max_retries: int = DEFAULT_MAX_RETRIES) -> EmbedResult:
    """Embed ``texts``; fatal errors (401, wrong model kind, no server left) propagate, others are retried."""
    run = _Run(pool, packer, texts, dimension, max_retries)
    return await run.execute()


class _Run:
    def __init__(self, pool: EndpointPool, packer: RequestPacker, texts: Sequence[str],
                 dimension: int, max_retries: int) -> None:
        self.pool = pool
        self.packer = packer
        self.texts = texts
        self.max_retries = max_retries
        self.vectors = np.zeros((len(texts), dimension), dtype=np.float32)
        self.ok = np.zeros(len(texts), dtype=bool)
        self.failures: list[Failure] = []
        self.queue: asyncio.Queue[Batch] = asyncio.Queue()
        self.pending = 0
        self.overloads = 0

    async def execute(self) -> EmbedResult:
        sendable = []
        for position, text in enumerate(self.texts):
            if self.packer.fits_alone(orjson.dumps(text)):
                sendable.append((position, text))
            else:
                self.failures.append(Failure(position, FAILURE_PAYLOAD,
                                             f"the text alone is over the {self.packer.payload_limit}-byte "
                                             "request limit"))
        for batch in self.packer.pack(sendable):
            self._put(batch)
        if self.pending:
            workers = max(1, self.pool.capacity // max(1, self.packer.max_batch_size))
            tasks = [asyncio.create_task(self._worker()) for _ in range(min(workers, self.pending))]
            try:
                await asyncio.gather(*tasks)
            finally:
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
        self.failures.sort(key=lambda f: f.position)
        return EmbedResult(self.vectors, self.ok, self.failures)

    def _put(self, batch: Batch) -> None:
        self.pending += 1
        self.queue.put_nowait(batch)

    async def _worker(self) -> None:
        while self.pending:
            try:
                batch = self.queue.get_nowait()
            except asyncio.QueueEmpty:
                # Another worker holds the last batches; one may come back split or retried.
                await asyncio.sleep(0.01)
                continue
            try:
                await self._send(batch)
            finally:
                self.pending -= 1

    async def _send(self, batch: Batch) -> None:
        count = batch.request.count
        server = await self.pool.acquire(count)
        loop = asyncio.get_running_loop()
        started = loop.time()
        try:
            vectors = await server.client.embed(batch.request)
        except TeiError as exc:
            server.stats.count_error(type(exc).__name__)
            await self.pool.release(server, count)
            await self._handle(batch, server, exc)
            return
        server.stats.seconds += loop.time() - started
        server.stats.requests += 1
        server.stats.inputs += count
        await self.pool.release(server, count)
        positions = np.fromiter(batch.positions, dtype=np.int64, count=count)
        self.vectors[positions] = vectors
        self.ok[positions] = True

    async def _handle(self, batch: Batch, server: Server, exc: TeiError) -> None:
        if isinstance(exc, TeiOverloaded):
            # Nothing was processed: wait and resend; bounded, so a stuck server cannot loop forever.
            self.overloads += 1
            if self.overloads > MAX_OVERLOAD_RETRIES * max(1, len(self.pool.servers)):
                raise exc
            server.stats.retries += 1
            await asyncio.sleep(exc.retry_after or backoff(min(batch.attempt, 6)))
            self._put(Batch(batch.positions, batch.request, batch.attempt))
            return
        if isinstance(exc, PayloadTooLarge | TooManyInputs | InputTooLong | TeiRequestError):
            reason = {InputTooLong: FAILURE_TOO_LONG, PayloadTooLarge: FAILURE_PAYLOAD,
                      TooManyInputs: FAILURE_PAYLOAD}.get(type(exc), FAILURE_REFUSED)
            self._split_or_fail(batch, reason, exc)
            return
        if isinstance(exc, TeiUnavailable):
            if exc.status_code is None or exc.status_code == 503:
                await self.pool.mark_down(server)
            if batch.attempt >= self.max_retries:
                self._split_or_fail(batch, FAILURE_EMBED, exc)
                return
            server.stats.retries += 1
            await asyncio.sleep(backoff(batch.attempt, base=0.2))
            self._put(Batch(batch.positions, batch.request, batch.attempt + 1))
            return
        raise exc

    def _split_or_fail(self, batch: Batch, reason: str, exc: TeiError) -> None:
        if len(batch.positions) > 1:
            for half in self.packer.split(batch, self.texts):
                self._put(half)
            return
        detail = str(exc)
        self.failures.append(Failure(batch.positions[0], reason, detail))
