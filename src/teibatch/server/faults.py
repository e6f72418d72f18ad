"""Seeded fault injection on the inference routes, for tests of clients' retry and failover code.

Per inference request (``POST`` to an embedding or ranking route, after the API key check) one draw
from ``random.Random(seed)`` picks at most one of: 429 ``Model is overloaded``, 503 ``unhealthy``,
424 ``Backend error: ...``, 500 (text/plain, as a proxy in front of TEI would send), or a connection
dropped halfway through a 200 answer; a second draw adds a latency spike. The request numbered
``hang_after`` never gets an answer; after ``exit_after`` answered requests the server stops (the
``serve`` command then exits with code 3). With ``tokenize`` on, ``POST /tokenize`` draws too (a
proxy in front of TEI can answer 429 or 5xx there, though TEI never does). Each fault counts in
``teibatch_fault_injected{kind}`` and in ``/teibatch/stats``; injected 429s are not counted as
client violations.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from aiohttp import web

from teibatch.server.config import FaultConfig
from teibatch.server.metrics import Metrics
from teibatch.server.responses import ApiError, backend, overloaded
from teibatch.server.state import route_of

INJECTED_BACKEND_ERROR = "Backend error: CUDA error: out of memory (injected by teibatch)"
FAULT_ROUTES = frozenset({"/embed", "/embed_all", "/embed_sparse", "/predict", "/rerank", "/similarity",
                          "/embeddings", "/v1/embeddings", "/", "/invocations"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True)
class Decision:
    """What happens to one request: ``error`` is a fault kind or None; the flags add to it."""

    error: str | None
    latency: bool
    hang: bool


class FaultInjector:
    """Draws decisions in request order from one seeded generator; counts what it injects."""

    def __init__(self, config: FaultConfig, metrics: Metrics) -> None:
        self.config = config
        self.metrics = metrics
        self.random = random.Random(config.seed)
        self.requests = 0
        self.answered = 0
        self.request_stop: Callable[[], None] | None = None

    def next(self) -> Decision:
        """The decision for the next inference request."""
        self.requests += 1
        c = self.config
        draw = self.random.random()
        error = None
        edge = 0.0
        for kind, rate in (("429", c.rate_429), ("503", c.rate_503), ("424", c.rate_424),
                           ("500", c.rate_500), ("drop", c.rate_drop)):
            edge += rate
            if draw < edge:
                error = kind
                break
        latency = self.random.random() < c.rate_latency
        return Decision(error, latency, c.hang_after == self.requests)

    def after_answer(self) -> None:
        """Count an answered request; stop the server once ``exit_after`` are answered."""
        self.answered += 1
        if self.config.exit_after is not None and self.answered == self.config.exit_after:
            self.metrics.fault("exit")
            if self.request_stop is not None:
                self.request_stop()


FAULTS: web.AppKey[FaultInjector] = web.AppKey("teibatch_faults", FaultInjector)


async def _drop_midway(request: web.Request, response: web.Response) -> web.StreamResponse:
    """Send the headers and half of the body, then reset the connection."""
    body = response.body if isinstance(response.body, bytes) else b""
    stream = web.StreamResponse(status=response.status, headers=response.headers)
    stream.content_length = len(body)
    await stream.prepare(request)
    await stream.write(body[: len(body) // 2])
    if request.transport is not None:
        request.transport.abort()
    return stream


@web.middleware
async def inject_faults(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Apply the next decision to an inference request; every other request passes untouched."""
    injector = request.app[FAULTS]
    route = route_of(request)
    drawn = route in FAULT_ROUTES or (route == "/tokenize" and injector.config.tokenize)
    if not injector.config.enabled or request.method != "POST" or not drawn:
        return await handler(request)
    decision = injector.next()
    metrics = injector.metrics
    try:
        if decision.hang:
            metrics.fault("hang")
            await asyncio.Event().wait()  # until the server stops and cancels this handler
        if decision.latency:
            metrics.fault("latency")
            await asyncio.sleep(injector.config.latency_s)
        if decision.error is not None and decision.error != "drop":
            metrics.fault(decision.error)
            if decision.error == "500":
                return web.Response(status=500, text="Internal Server Error", content_type="text/plain")
            raise _error(decision.error)
        response = await handler(request)
        if decision.error == "drop" and isinstance(response, web.Response) and response.status == 200:
            metrics.fault("drop")
            return await _drop_midway(request, response)
        return response
    finally:
        # The server shuts down gracefully, so this request's answer still goes out.
        injector.after_answer()


def _error(kind: str) -> ApiError:
    if kind == "429":
        return overloaded(violation=None)
    if kind == "503":
        return ApiError("Unhealthy", "unhealthy")
    return backend(INJECTED_BACKEND_ERROR, metric="inference")
