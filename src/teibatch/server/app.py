"""The aiohttp application: TEI's routes, its auth rule, and one place that turns errors into answers.

Routes (TEI ``router/src/http/server.rs``): public ``GET /health``, ``/``, ``/ping``, ``/metrics``;
behind ``--api-key``: ``GET /info`` and every ``POST`` route, including ``POST /`` and
``/invocations`` (the alias for the model's kind). teibatch adds ``GET``/``DELETE /teibatch/stats``
(public, for tests). Unknown paths answer 404 and wrong methods 405, both with empty bodies, as axum.

The API key is checked before the body is read, so an unauthenticated oversize body gets 401,
not 413. aiohttp's own body limit is switched off: :mod:`teibatch.server.bodies` enforces
``payload_limit`` itself, to answer with axum's exact 413.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import replace

from aiohttp import web

from teibatch.server import faults, routes_embed, routes_info, routes_rank
from teibatch.server.backends import load_backend
from teibatch.server.backends.base import Backend
from teibatch.server.batching import BatchQueue
from teibatch.server.bodies import PayloadTooLargeError
from teibatch.server.config import ServerConfig
from teibatch.server.metrics import Metrics
from teibatch.server.responses import ApiError, Rejection
from teibatch.server.state import STATE, Permits, ServerState, route_of

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

PUBLIC_ROUTES = frozenset({("GET", "/health"), ("GET", "/"), ("GET", "/ping"), ("GET", "/metrics"),
                           ("GET", "/teibatch/stats"), ("DELETE", "/teibatch/stats")})
OPENAI_ROUTES = frozenset({"/v1/embeddings", "/embeddings"})


@web.middleware
async def answer_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Count the request, and render ApiError / Rejection / 404 / 405 as TEI and axum do."""
    state = request.app[STATE]
    metrics = state.metrics
    route = route_of(request)
    metrics.requests_by_route[route or "unmatched"] += 1
    if request.content_length:
        metrics.max_body_bytes = max(metrics.max_body_bytes, request.content_length)
    response: web.StreamResponse
    try:
        response = await handler(request)
    except ApiError as exc:
        if exc.metric:
            metrics.inc("te_request_failure", err=exc.metric)
        if exc.violation:
            metrics.violation(exc.violation)
        response = exc.response(openai=route in OPENAI_ROUTES)
    except Rejection as exc:
        if isinstance(exc, PayloadTooLargeError):
            metrics.violation("payload")
        response = exc.response()
    except web.HTTPException as exc:
        if exc.status not in (404, 405):
            raise
        headers = {"Allow": exc.headers["Allow"]} if "Allow" in exc.headers else None
        response = web.Response(status=exc.status, headers=headers)
    metrics.responses_by_status[str(response.status)] += 1
    return response


@web.middleware
async def require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
    """401 with an empty body unless ``Authorization`` is exactly ``Bearer <key>`` (protected routes only)."""
    key = request.app[STATE].config.api_key
    route = route_of(request)
    method = "GET" if request.method == "HEAD" else request.method  # HEAD is public where GET is
    if key and route is not None and (method, route) not in PUBLIC_ROUTES \
            and request.headers.get("Authorization") != f"Bearer {key}":
        return web.Response(status=401)
    return await handler(request)


async def invocations(request: web.Request) -> web.StreamResponse:
    """``POST /`` and ``/invocations``: the route for this model's kind (embed, rerank or embed_sparse)."""
    config = request.app[STATE].config
    if config.model_kind == "reranker":
        return await routes_rank.rerank(request)
    if config.pooling == "splade":
        return await routes_embed.embed_sparse(request)
    return await routes_embed.embed(request)


def create_app(config: ServerConfig, backend: Backend | None = None) -> web.Application:
    """The application for ``config``; ``backend`` defaults to the one ``config.backend`` names.

    The batching task starts with the app (``on_startup``) and stops with it (``on_cleanup``).
    """
    backend = backend if backend is not None else load_backend(config)
    model_limit = getattr(backend, "max_input_length", None)
    if model_limit is not None and model_limit < config.max_input_length:
        config = replace(config, max_input_length=model_limit)  # TEI takes it from the model
    metrics = Metrics(record_texts=config.record_texts)
    state = ServerState(config=config, backend=backend, metrics=metrics,
                        queue=BatchQueue(backend, config, metrics),
                        permits=Permits(config.max_concurrent_requests, metrics))
    app = web.Application(middlewares=[answer_errors, require_api_key, faults.inject_faults],
                          client_max_size=2**63)
    app[STATE] = state
    app[faults.FAULTS] = faults.FaultInjector(config.faults, metrics)

    for path in ("/health", "/", "/ping"):
        app.router.add_get(path, routes_info.health)
    app.router.add_get("/info", routes_info.info)
    app.router.add_get("/metrics", routes_info.metrics)
    app.router.add_get("/teibatch/stats", routes_info.stats)
    app.router.add_delete("/teibatch/stats", routes_info.stats)
    app.router.add_post("/embed", routes_embed.embed)
    app.router.add_post("/v1/embeddings", routes_embed.openai_embed)
    app.router.add_post("/embeddings", routes_embed.openai_embed)
    app.router.add_post("/embed_sparse", routes_embed.embed_sparse)
    app.router.add_post("/embed_all", routes_embed.embed_all)
    app.router.add_post("/similarity", routes_embed.similarity)
    app.router.add_post("/rerank", routes_rank.rerank)
    app.router.add_post("/predict", routes_rank.predict)
    app.router.add_post("/tokenize", routes_info.tokenize)
    app.router.add_post("/decode", routes_info.decode)
    app.router.add_post("/", invocations)
    app.router.add_post("/invocations", invocations)

    async def start_batcher(app: web.Application) -> None:
        app[STATE].queue.start()

    async def stop_batcher(app: web.Application) -> None:
        await app[STATE].queue.stop()

    app.on_startup.append(start_batcher)
    app.on_cleanup.append(stop_batcher)
    return app
