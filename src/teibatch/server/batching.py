"""The server-side queue and batcher, and the capacity model that lets a CPU stand in for a GPU.

Like TEI's ``core/src/queue.rs``: inputs from all requests wait in one FIFO queue; one batcher task
takes as many as fit in ``max_batch_tokens`` (and ``max_batch_requests``), runs them through the
backend as one batch, and answers each input's future. A backend failure fails every input of that
batch (TEI: a CUDA error fails the whole server-side batch).

With ``simulate_gpu`` (tokens/s) a batch is answered ``batch_overhead_s + tokens / simulate_gpu``
seconds after it started, however fast the vectors were computed, so a cheap backend behaves like
a GPU of that throughput: latency grows with load, throughput saturates at the configured rate,
and ``te_queue_size`` rises when clients send faster than that.

The simulated GPU keeps its own clock. A batch starts when the one before it ended *on that clock*
(or, when the queue was empty then, when its first input came), and ends exactly ``model time``
later; only the answers wait for this process's event loop. Timed by the loop instead, every batch
also took whatever time the loop spent elsewhere when it was due (answering requests, reading new
ones, a neighbour holding the CPU): on 2 busy cores that made a 16 ms batch 17.6 ms, a GPU 10%
slower than asked for. A batch takes only inputs that were queued when it started on that clock.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from teibatch.server.backends.base import Backend, pair_logits
from teibatch.server.config import ServerConfig
from teibatch.server.metrics import Metrics
from teibatch.server.responses import backend as backend_error

OPS = ("embed", "raw", "sparse", "score", "all")
"""``embed``: normalized vector; ``raw``: unnormalized vector; ``sparse``: SPLADE entries;
``score``: (query, text) logit; ``all``: one unnormalized vector per token (``/embed_all``)."""


class Request:
    """The inputs of one request in the queue, answered together: ``future`` gets every result, in
    order, once the last is in (or the first ApiError). One future a request, not one an input: a
    server answers hundreds of inputs a second per core, and each future awaited alone cost more
    than counting its tokens."""

    def __init__(self, future: asyncio.Future[list[Any]], size: int) -> None:
        self.future = future
        self.jobs: list[Job] = []
        self._results: list[Any] = [None] * size
        self._left = size

    @property
    def abandoned(self) -> bool:
        """The request already has its answer, or its client went away (the future was cancelled)."""
        return self.future.done()

    def answer(self, index: int, result: Any) -> None:
        """Input ``index``'s result; the last one answers the request."""
        if self.future.done():
            return
        self._results[index] = result
        self._left -= 1
        if self._left == 0:
            self.future.set_result(self._results)

    def fail(self, error: BaseException) -> None:
        """The request fails with ``error`` (its first failure: a batch it had inputs in failed)."""
        if not self.future.done():
            self.future.set_exception(error)


@dataclass
class Job:
    """One input waiting for the backend, the ``index``-th of its ``request``."""

    op: str
    text: str
    tokens: int
    request: Request
    index: int = 0
    query: str = ""
    enqueued: float = field(default_factory=time.perf_counter)
    started: float = 0.0
    finished: float = 0.0


def _compute(backend: Backend, jobs: list[Job]) -> list[Any]:
    """Results of one batch, in job order; jobs of one op go to the backend together."""
    results: list[Any] = [None] * len(jobs)
    for op in OPS:
        index = [i for i, job in enumerate(jobs) if job.op == op]
        if not index:
            continue
        texts = [jobs[i].text for i in index]
        out: Any
        if op == "embed":
            out = backend.embed(texts, normalize=True)
        elif op == "raw":
            out = backend.embed(texts, normalize=False)
        elif op == "sparse":
            out = backend.embed_sparse(texts)
        elif op == "score":
            out = pair_logits(backend, [(jobs[i].query, jobs[i].text) for i in index])
        else:
            out = [backend.embed([t.text for t in backend.tokenizer.encode(text)], normalize=False)
                   for text in texts]
        for i, value in zip(index, out, strict=True):
            results[i] = value
    return results


class BatchQueue:
    """The queue plus its batcher task; start with :meth:`start`, stop with :meth:`stop`."""

    def __init__(self, backend: Backend, config: ServerConfig, metrics: Metrics) -> None:
        self.backend = backend
        self.config = config
        self.metrics = metrics
        self._jobs: collections.deque[Job] = collections.deque()
        self._wakeup = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._gpu_free_at = 0.0  # when the simulated GPU ended its last batch, on its own clock (perf_counter)

    @property
    def size(self) -> int:
        """Inputs waiting (not yet in a running batch): TEI's ``te_queue_size``."""
        return len(self._jobs)

    def start(self) -> None:
        """Start the batcher task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="teibatch-batcher")

    async def stop(self) -> None:
        """Cancel the batcher and fail whatever still waits."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        while self._jobs:
            self._jobs.popleft().request.future.cancel()

    def submit(self, op: str, texts: list[str], tokens: list[int],
               queries: list[str] | None = None) -> Request:
        """Queue inputs of one request, in order; await the request's ``future`` for their results."""
        request = Request(asyncio.get_running_loop().create_future(), len(texts))
        arrived = time.perf_counter()  # one time for the request's inputs: they came together
        request.jobs = [Job(op=op, text=text, tokens=n, request=request, index=i,
                            query=queries[i] if queries else "", enqueued=arrived)
                        for i, (text, n) in enumerate(zip(texts, tokens, strict=True))]
        self._jobs.extend(request.jobs)
        self.metrics.gauges["te_queue_size"] = len(self._jobs)
        self._wakeup.set()
        return request

    def _next_batch(self, queued_by: float) -> list[Job]:
        """The inputs of the next batch, oldest first, of those queued by ``queued_by``."""
        batch: list[Job] = []
        total = 0
        max_requests = self.config.max_batch_requests
        while self._jobs:
            job = self._jobs[0]
            if job.request.abandoned:
                self._jobs.popleft()
                if job.request.future.cancelled():  # the client went away (TEI: te_request_failure{err="dropped"})
                    self.metrics.inc("te_request_failure", err="dropped")
                continue
            if batch and (total + job.tokens > self.config.max_batch_tokens
                          or (max_requests is not None and len(batch) >= max_requests)
                          or job.enqueued > queued_by):
                break
            batch.append(self._jobs.popleft())
            total += job.tokens
        self.metrics.gauges["te_queue_size"] = len(self._jobs)
        return batch

    async def _run(self) -> None:
        while True:
            if not self._jobs:
                self._wakeup.clear()
                await self._wakeup.wait()
            started = self._gpu_start()
            batch = self._next_batch(started)
            if batch:
                await self._run_batch(batch, started)

    def _gpu_start(self) -> float:
        """When the next batch starts: now, or with ``simulate_gpu``, on the simulated GPU's clock (module doc)."""
        now = time.perf_counter()
        if not self.config.simulate_gpu or not self._jobs:
            return now
        return max(self._gpu_free_at, min(now, self._jobs[0].enqueued))

    async def _run_batch(self, batch: list[Job], started: float) -> None:
        tokens = sum(job.tokens for job in batch)
        self.metrics.observe("te_batch_next_size", len(batch))
        self.metrics.observe("te_batch_next_tokens", tokens)
        for job in batch:
            job.started = started
        computing = time.perf_counter()
        try:
            if self.backend.heavy:
                results = await asyncio.to_thread(_compute, self.backend, batch)
            else:
                results = _compute(self.backend, batch)
        except Exception as exc:  # any backend failure fails the whole batch, as in TEI
            error = backend_error(f"Backend error: {exc}", metric="inference")
            for job in batch:
                job.request.fail(error)
            return
        if self.config.simulate_gpu:
            # Never sooner than this CPU computed the batch: a backend slower than the asked rate sets the pace.
            finished = started + max(self.config.batch_overhead_s + tokens / self.config.simulate_gpu,
                                     time.perf_counter() - computing)
            self._gpu_free_at = finished
            remaining = finished - time.perf_counter()
            if remaining > 0:
                await asyncio.sleep(remaining)
        else:
            finished = time.perf_counter()
        self.metrics.batches += 1
        self.metrics.model_busy(started, finished)
        for job, result in zip(batch, results, strict=True):
            job.finished = finished
            job.request.answer(job.index, np.asarray(result) if job.op in ("embed", "raw") else result)
