"""Measure one setting: drive every server at it through a warm-up, a window and a drain.

Each setting drives all servers at once (``POST /embed`` with the :class:`TeiClient`, so answers are
checked as in a run). A refused key (401), a model that is not an embedding model (424) or a server
that refuses connections makes every setting meaningless: :func:`measure` raises it. Every other
error (429, 413, 422, other 424s, 5xx, timeouts, dropped connections, wrong answers) is counted by
kind (:func:`error_kind`).
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Sequence

import anyio
import httpx

from teibatch.bench.grid import Setting
from teibatch.bench.results import UNANSWERED, Answer, SettingResult, error_counts, percentiles, server_result
from teibatch.errors import ServerFault, TeiAuthError, TeiError, TeiUnavailable, WrongModelKind
from teibatch.tei import EmbedRequest, TeiClient

WARMUP_S = 1.0
WARMUP_SHARE = 0.25
"""Each setting first runs at least ``min(WARMUP_S, WARMUP_SHARE × its window)`` unmeasured, and
until every slot has had an answer (:func:`measure`): connections open, the queue reaches its
steady state."""
DRAIN_S = 2.0
DRAIN_LATENCIES = 2.0
"""After a window, requests still in flight get ``max(DRAIN_S, DRAIN_LATENCIES × the slowest answer
of the window)`` to finish (never past the deadline): their work inside the window counts, and the
next setting does not start against a server still busy with this one's inputs."""
ERROR_PAUSE_S = 0.05
"""A worker whose request failed waits this long before the next, so a refusing server is not
flooded by a loop that spins at CPU speed."""


def setting_seconds(seconds: float) -> float:
    """The least wall time of one setting measured for ``seconds``: its shortest warm-up and its window
    (a slow server adds up to one latency of warm-up and two of drain, never past the deadline)."""
    return min(WARMUP_S, WARMUP_SHARE * seconds) + seconds


def error_kind(exc: TeiError) -> str:
    """The column an error counts in: ``429``, ``413``, ``422``, ``424`` (a backend failure), ``5xx``,
    ``4xx`` (any other), ``timeout``, ``connection`` (no answer), ``bad answer`` (a wrong 200)."""
    if isinstance(exc, ServerFault):
        return "bad answer"
    status = exc.status_code
    if status is None:
        return "timeout" if isinstance(exc.__cause__, TimeoutError | httpx.TimeoutException) else "connection"
    if status >= 500:
        return "5xx"
    return str(status) if status in (413, 422, 424, 429) else "4xx"


def _fatal(exc: TeiError) -> bool:
    """Errors that make every setting meaningless: a refused key, a model that gives no dense
    vectors, a server that refuses connections (not running, or gone)."""
    refused = isinstance(exc, TeiUnavailable) and isinstance(exc.__cause__, httpx.ConnectError)
    return refused or isinstance(exc, TeiAuthError | WrongModelKind)


async def measure(setting: Setting, clients: Sequence[TeiClient], requests: Sequence[tuple[EmbedRequest, int]],
                  *, seconds: float, deadline: float) -> SettingResult:
    """Drive every client at ``setting`` (``setting.requests`` slots each, cycling through
    ``requests``: (request, its tokens)) through a warm-up and a window of ``seconds``; see
    :func:`~teibatch.bench.results.server_result` for what counts. Raises the first fatal
    :class:`TeiError` (:func:`_fatal`).

    The warm-up lasts until every slot has had its first answer (at least ``WARMUP_S``, or a quarter
    of the window if shorter): the first answers come back from a queue that all slots filled at
    once, faster than in the steady state, and would inflate the rate.
    """
    answers: list[list[Answer]] = [[] for _ in clients]
    stop, warm = asyncio.Event(), asyncio.Event()
    fatal: list[TeiError] = []
    cold = {(i, slot) for i in range(len(clients)) for slot in range(setting.requests)}
    began = time.monotonic()

    async def worker(server: int, slot: int, turn: itertools.count[int]) -> None:
        last = began
        while not stop.is_set():
            request, tokens = requests[next(turn) % len(requests)]
            sent = time.monotonic()
            kind = None
            try:
                await clients[server].embed(request)
            except TeiError as exc:
                if _fatal(exc):
                    fatal.append(exc)
                    stop.set()
                    warm.set()
                    return
                kind = error_kind(exc)
            except asyncio.CancelledError:
                answers[server].append(Answer(last, sent, time.monotonic(), request.count, tokens, UNANSWERED))
                raise
            done = time.monotonic()
            answers[server].append(Answer(last, sent, done, request.count, tokens, kind))
            last = done
            cold.discard((server, slot))
            if not cold:
                warm.set()
            if kind:
                await asyncio.sleep(ERROR_PAUSE_S)

    tasks = [asyncio.create_task(worker(i, slot, turn)) for i in range(len(clients))
             for turn in [itertools.count()] for slot in range(setting.requests)]
    try:
        await asyncio.sleep(min(WARMUP_S, WARMUP_SHARE * seconds))
        with anyio.move_on_after(deadline - seconds - time.monotonic()):
            await warm.wait()
        opens = time.monotonic()
        with anyio.move_on_after(seconds):
            await stop.wait()
        stop.set()
        # Requests in flight at the close hold part of the window's work: wait for them (about one latency).
        slowest = max((a.done - a.sent for server in answers for a in server), default=0.0)
        drain = min(max(DRAIN_S, DRAIN_LATENCIES * slowest), deadline - time.monotonic())
        if not fatal:
            await asyncio.wait(tasks, timeout=max(0.0, drain))
    finally:
        for task in tasks:
            task.cancel()
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    if fatal:
        raise fatal[0]
    for outcome in outcomes:
        if isinstance(outcome, Exception):
            raise outcome  # a bug, not a server's answer: CancelledError is not an Exception
    window = (opens, opens + seconds)
    servers = [server_result(c.url, a, window) for c, a in zip(clients, answers, strict=True)]
    done = [a for server in answers for a in server if a.kind is None and window[0] <= a.done <= window[1]]
    return SettingResult(setting, seconds, len(done), sum(a.documents for a in done), sum(a.tokens for a in done),
                         percentiles([a.done - a.sent for a in done]), dict(error_counts(servers)), tuple(servers))
