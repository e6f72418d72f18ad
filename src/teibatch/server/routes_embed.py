"""The embedding routes: ``/embed``, ``/v1/embeddings`` (and ``/embeddings``), ``/embed_sparse``,
``/embed_all`` and ``/similarity``.

Each follows the order of checks of TEI's handlers (``router/src/http/server.rs``): JSON
(415/413/400/422 plain text), empty, batch size (422), per-input permits (429), model kind (424),
per-input tokenization (400/422), queue, backend (424), ``dimensions`` (422). The OpenAI route
hard-codes what TEI hard-codes: ``truncate`` = ``--auto-truncate``, direction right, no prompt name,
``normalize`` true.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pybase64
from aiohttp import web

from teibatch.server.backends.base import SPARSE_VOCAB_SIZE
from teibatch.server.bodies import (
    EmbedParams,
    Item,
    SimilarityParams,
    parse_embed,
    parse_openai,
    parse_similarity,
    read_json,
)
from teibatch.server.inference import Outcome, RequestTimer, admit
from teibatch.server.responses import (
    NOT_EMBEDDING_MODEL,
    NOT_SPLADE_MODEL,
    SPLADE_NO_EMBED_ALL,
    SPLADE_NO_NORMALIZE,
    ApiError,
    backend,
    json_response,
)
from teibatch.server.state import STATE, ServerState
from teibatch.server.validation import prepare_all


def _embedding_kind(state: ServerState, *, normalize: bool) -> str:
    """The queue op for a dense embedding, or 424 when this model cannot give one."""
    config = state.config
    if config.model_kind != "embedding":
        raise backend(NOT_EMBEDDING_MODEL)
    if config.pooling == "splade":
        if normalize:
            raise backend(SPLADE_NO_NORMALIZE)
        return "sparse"
    return "embed" if normalize else "raw"


async def _prepare_and_run(state: ServerState, timer: RequestTimer, op: str, items: list[Item],
                           params: EmbedParams | SimilarityParams, *, dimensions: int | None = None,
                           dimension: int | None = None) -> Outcome:
    """Prepare ``items`` with the request's truncation and prompt options, then queue them as ``op``.

    ``dimensions`` and ``dimension`` are checked as :func:`~teibatch.server.validation.prepare_all` does.
    """
    prepared = prepare_all(items, tokenizer=state.backend.tokenizer, config=state.config,
                           truncate=params.truncate, direction=params.direction, prompt_name=params.prompt_name,
                           dimensions=dimensions, dimension=dimension)
    timer.mark_tokenized()
    return await timer.run(op, prepared, items=items)


async def _embed(state: ServerState, params: EmbedParams) -> Outcome:
    """The dense-embedding flow shared by ``/embed`` and the OpenAI route; vectors as float32 rows."""
    with admit(state, len(params.items), is_batch=params.is_batch, family="embed") as timer:
        op = _embedding_kind(state, normalize=params.normalize)
        dimension = SPARSE_VOCAB_SIZE if op == "sparse" else state.backend.dimension
        dims = params.dimensions
        if dims is not None and op == "embed":
            op = "raw"  # cut first, then normalize the cut vector (TEI's embed_pooled)
        outcome = await _prepare_and_run(state, timer, op, params.items, params, dimensions=dims,
                                         dimension=dimension)
    vectors = [_densify(v) if op == "sparse" else np.asarray(v) for v in outcome.results]
    if dims is not None:
        vectors = [_cut(v, dims, normalize=params.normalize) for v in vectors]
    return Outcome(vectors, outcome.tokens, outcome.headers)


def _densify(entry: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    dense = np.zeros(SPARSE_VOCAB_SIZE, dtype=np.float32)
    dense[entry[0]] = entry[1]
    return dense


def _cut(vector: np.ndarray, dims: int, *, normalize: bool) -> np.ndarray:
    cut = vector[:dims].astype(np.float64)
    if normalize:
        cut = cut / max(float(np.sqrt(cut @ cut)), 1e-12)
    return cut.astype(np.float32)


async def embed(request: web.Request) -> web.Response:
    """``POST /embed`` → ``[[f32, ...], ...]`` in input order."""
    state = request.app[STATE]
    params = parse_embed(await read_json(request, state.config.payload_limit))
    outcome = await _embed(state, params)
    return json_response(np.stack(outcome.results), headers=outcome.headers)


async def openai_embed(request: web.Request) -> web.Response:
    """``POST /v1/embeddings`` and ``/embeddings``: OpenAI's shape, ``float`` or ``base64`` vectors."""
    state = request.app[STATE]
    params = parse_openai(await read_json(request, state.config.payload_limit))
    outcome = await _embed(state, params)
    data = []
    for i, vector in enumerate(outcome.results):
        embedding: Any = vector
        if params.encoding_format == "base64":
            embedding = pybase64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")
        data.append({"object": "embedding", "embedding": embedding, "index": i})
    body = {"object": "list", "data": data, "model": state.config.model_name,
            "usage": {"prompt_tokens": outcome.tokens, "total_tokens": outcome.tokens}}
    return json_response(body, headers=outcome.headers)


async def embed_sparse(request: web.Request) -> web.Response:
    """``POST /embed_sparse`` → per input ``[{"index", "value"}, ...]`` (SPLADE pooling only)."""
    state = request.app[STATE]
    params = parse_embed(await read_json(request, state.config.payload_limit), "EmbedSparseRequest")
    with admit(state, len(params.items), is_batch=params.is_batch, family="embed") as timer:
        if state.config.model_kind != "embedding" or state.config.pooling != "splade":
            raise backend(NOT_SPLADE_MODEL)
        outcome = await _prepare_and_run(state, timer, "sparse", params.items, params)
    body = [[{"index": int(i), "value": float(v)} for i, v in zip(idx, values, strict=True)]
            for idx, values in outcome.results]
    return json_response(body, headers=outcome.headers)


async def embed_all(request: web.Request) -> web.Response:
    """``POST /embed_all`` → per input, one vector per token (special tokens included)."""
    state = request.app[STATE]
    params = parse_embed(await read_json(request, state.config.payload_limit), "EmbedAllRequest")
    with admit(state, len(params.items), is_batch=params.is_batch, family="embed") as timer:
        if state.config.model_kind != "embedding":
            raise backend(NOT_EMBEDDING_MODEL)
        if state.config.pooling == "splade":
            raise backend(SPLADE_NO_EMBED_ALL)
        outcome = await _prepare_and_run(state, timer, "all", params.items, params)
    return json_response([np.asarray(v) for v in outcome.results], headers=outcome.headers)


async def similarity(request: web.Request) -> web.Response:
    """``POST /similarity`` → cosine of each sentence with the source (batch size = sentences + 1)."""
    state = request.app[STATE]
    params = parse_similarity(await read_json(request, state.config.payload_limit))
    if not params.sentences:
        raise ApiError("Empty", "`inputs.sentences` cannot be empty", metric="validation")
    items: list[Item] = [params.source, *params.sentences]
    with admit(state, len(items), is_batch=True, family="embed") as timer:
        if state.config.model_kind != "embedding" or state.config.pooling == "splade":
            raise backend(NOT_EMBEDDING_MODEL)
        outcome = await _prepare_and_run(state, timer, "raw", items, params)
    vectors = np.stack(outcome.results).astype(np.float64)
    norms = np.maximum(np.linalg.norm(vectors, axis=1), 1e-12)
    cosines = (vectors[1:] @ vectors[0]) / (norms[1:] * norms[0])
    return json_response(cosines.astype(np.float32), headers=outcome.headers)
