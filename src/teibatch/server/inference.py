"""The part every inference route shares: queue the prepared inputs, await them, time them.

TEI sets the same ``x-compute-*`` / ``x-*-time`` headers on every successful inference answer
(``router/src/lib.rs``, ``impl From<ResponseMetadata> for HeaderMap``); for a batch the
tokenization, queue and inference times are averages per input. Request metrics
(``te_request_count/success``, ``te_embed_*``/``te_predict_*`` and their durations) are kept here too.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from teibatch.server.bodies import Item
from teibatch.server.state import ServerState
from teibatch.server.validation import Prepared


@dataclass(frozen=True)
class Outcome:
    """Results of one request's inputs, in input order, their tokens and the headers to send with them."""

    results: list[Any]
    tokens: int
    """Tokens of all inputs: the OpenAI ``usage`` numbers."""
    headers: dict[str, str]


class RequestTimer:
    """Started when a request's JSON is read; marks tokenization end; counts the request."""

    def __init__(self, state: ServerState, is_batch: bool, family: str) -> None:
        self.state = state
        self.method = "batch" if is_batch else "single"
        self.family = family
        self.started = time.perf_counter()
        self.tokenized = self.started
        state.metrics.inc("te_request_count", method=self.method)
        state.metrics.inc(f"te_{family}_count")

    def mark_tokenized(self) -> None:
        """Call when every input is prepared."""
        self.tokenized = time.perf_counter()

    async def run(self, op: str, prepared: list[Prepared], items: list[Item],
                  queries: list[str] | None = None) -> Outcome:
        """Queue ``prepared`` as ``op`` jobs, await all, count success and build the headers."""
        state = self.state
        request = state.queue.submit(op, [p.text for p in prepared], [p.tokens for p in prepared], queries)
        results = await request.future
        jobs = request.jobs
        done = time.perf_counter()
        n = len(jobs)
        tokenization = (self.tokenized - self.started) / max(n, 1)
        queue = sum(job.started - job.enqueued for job in jobs) / max(n, 1)
        inference = sum(job.finished - job.started for job in jobs) / max(n, 1)
        total = done - self.started
        metrics = state.metrics
        for duration_name, value in (("duration", total), ("tokenization_duration", tokenization),
                                     ("queue_duration", queue), ("inference_duration", inference)):
            metrics.observe(f"te_request_{duration_name}", value)
            metrics.observe(f"te_{self.family}_{duration_name}", value)
        metrics.observe_each("te_request_input_length", (p.tokens for p in prepared))
        metrics.inc("te_request_success", method=self.method)
        metrics.inc(f"te_{self.family}_success")
        tokens = sum(p.tokens for p in prepared)
        metrics.embedded(items, tokens)
        headers = {
            "x-compute-type": "gpu+optimized" if state.config.simulate_gpu else "cpu",
            "x-compute-time": _ms(total),
            "x-compute-characters": str(sum(p.chars for p in prepared)),
            "x-compute-tokens": str(tokens),
            "x-total-time": _ms(total),
            "x-tokenization-time": _ms(tokenization),
            "x-queue-time": _ms(queue),
            "x-inference-time": _ms(inference),
        }
        return Outcome(list(results), tokens, headers)


@contextmanager
def admit(state: ServerState, count: int, *, is_batch: bool, family: str) -> Iterator[RequestTimer]:
    """Count the request, check its batch size, then hold one permit per input for the block.

    In TEI's order: 422 for more than ``max_client_batch_size`` inputs, then 429 when not all
    ``count`` permits are free.
    """
    timer = RequestTimer(state, is_batch, family)
    state.check_batch_size(count)
    with state.permits.hold(count):
        yield timer


def _ms(seconds: float) -> str:
    return str(int(seconds * 1000))
