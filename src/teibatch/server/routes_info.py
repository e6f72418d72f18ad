"""The routes that embed nothing: ``/health``, ``/info``, ``/tokenize``, ``/decode``, ``/metrics``
and teibatch's own ``/teibatch/stats``.

``/tokenize`` and ``/decode`` check the batch size but take no permit (they never answer 429),
and ``/tokenize`` never truncates, as in TEI: an input over ``max_input_length * 250`` characters
fails the whole request with 422, as with truncation off on ``/embed``.
"""

from __future__ import annotations

from typing import Any

from aiohttp import web

from teibatch.server.bodies import parse_decode, parse_tokenize, read_json
from teibatch.server.config import TEI_VERSION
from teibatch.server.responses import ApiError, empty, json_response
from teibatch.server.state import STATE
from teibatch.server.validation import check_tokenize_input, resolve_prompt


async def health(request: web.Request) -> web.Response:
    """``GET /health`` (also ``/`` and ``/ping``): 200 with an empty body."""
    return web.Response(status=200)


async def info(request: web.Request) -> web.Response:
    """``GET /info``: TEI's ``Info``, field for field, in its serde order."""
    config = request.app[STATE].config
    if config.model_kind == "reranker":
        model_type: dict[str, Any] = {"reranker": {"id2label": {"0": "LABEL_0"}, "label2id": {"LABEL_0": 0}}}
    else:
        model_type = {"embedding": {"pooling": config.pooling}}
    return json_response({
        "model_id": config.model_id,
        "model_sha": config.revision,
        "model_dtype": "float32",
        "served_model_name": config.model_name,
        "model_type": model_type,
        "max_concurrent_requests": config.max_concurrent_requests,
        "max_input_length": config.effective_max_input_length,
        "max_batch_tokens": config.max_batch_tokens,
        "max_batch_requests": config.max_batch_requests,
        "max_client_batch_size": config.max_client_batch_size,
        "auto_truncate": config.auto_truncate,
        "tokenization_workers": config.tokenization_workers,
        "version": TEI_VERSION,
        "sha": None,
        "docker_label": None,
    })


async def tokenize(request: web.Request) -> web.Response:
    """``POST /tokenize`` → per input ``[{"id", "text", "special", "start", "stop"}]`` (byte offsets)."""
    state = request.app[STATE]
    params = parse_tokenize(await read_json(request, state.config.payload_limit))
    if params.is_batch and not params.texts:
        raise ApiError("Empty", "`inputs` cannot be empty", metric="validation")
    state.check_batch_size(len(params.texts))
    prompt = resolve_prompt(state.config, params.prompt_name)
    for text in params.texts:
        check_tokenize_input(text, state.config)
    tokenizer = state.backend.tokenizer
    body = [
        [{"id": t.id, "text": t.text, "special": t.special, "start": t.start, "stop": t.stop}
         for t in tokenizer.encode(prompt + text, params.add_special_tokens)]
        for text in params.texts
    ]
    return json_response(body)


async def decode(request: web.Request) -> web.Response:
    """``POST /decode`` → ``[str]``, one text per id list."""
    state = request.app[STATE]
    params = parse_decode(await read_json(request, state.config.payload_limit))
    if params.is_batch and not params.ids:
        raise ApiError("Empty", "`inputs` cannot be empty", metric="validation")
    state.check_batch_size(len(params.ids))
    if any(not ids for ids in params.ids):
        raise empty("`input_ids` cannot be empty")
    tokenizer = state.backend.tokenizer
    return json_response([tokenizer.decode(list(ids), params.skip_special_tokens) for ids in params.ids])


async def metrics(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text, public even with ``--api-key``."""
    state = request.app[STATE]
    state.metrics.gauges["te_queue_size"] = state.queue.size
    return web.Response(text=state.metrics.render(), content_type="text/plain")


async def stats(request: web.Request) -> web.Response:
    """``GET /teibatch/stats``: counts for tests (see :meth:`Metrics.stats`); ``DELETE`` also resets them."""
    state = request.app[STATE]
    body = state.stats()
    if request.method == "DELETE":
        state.metrics.reset()
    return json_response(body)
