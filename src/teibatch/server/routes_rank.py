"""The reranker routes: ``/rerank`` and ``/predict`` (a reranker is a classifier with one label).

Served when the server runs with ``model_kind="reranker"``; an embedding model answers 424 like
TEI. Scores come from :func:`teibatch.server.backends.base.pair_logits`; ``raw_scores`` gives the
logit, otherwise its sigmoid. A (query, text) pair counts ``tokens(query) + tokens(text) - 1``
tokens (``[CLS] q [SEP] t [SEP]``); when over ``max_input_length`` the text is cut.
"""

from __future__ import annotations

import numpy as np
from aiohttp import web

from teibatch.server.backends.base import sigmoid
from teibatch.server.bodies import parse_predict, parse_rerank, read_json
from teibatch.server.inference import admit
from teibatch.server.responses import (
    NOT_CLASSIFIER_MODEL,
    NOT_RERANKER_MODEL,
    ApiError,
    backend,
    json_response,
)
from teibatch.server.state import STATE, ServerState
from teibatch.server.validation import Prepared, prepare, too_long

LABEL = "LABEL_0"


def _prepare_pair(state: ServerState, query: str, text: str, truncate: bool | None,
                  direction: str) -> Prepared:
    """The text side of a pair, cut so the whole pair fits ``max_input_length``."""
    config = state.config
    tokenizer = state.backend.tokenizer
    q = prepare(query, tokenizer=tokenizer, config=config, truncate=truncate, direction=direction, prompt="")
    t = prepare(text, tokenizer=tokenizer, config=config, truncate=truncate, direction=direction, prompt="")
    max_length = config.effective_max_input_length
    total = q.tokens + t.tokens - 1
    if total <= max_length:
        return Prepared(t.text, total, q.chars + t.chars)
    if not (config.auto_truncate if truncate is None else truncate):
        raise too_long(max_length, total)
    room = max(max_length - q.tokens + 1, 3)
    cut = tokenizer.truncate(t.text, room, direction)
    return Prepared(cut, q.tokens + tokenizer.count(cut) - 1, q.chars + t.chars)


async def rerank(request: web.Request) -> web.Response:
    """``POST /rerank`` → ``[{"index", "score", "text"?}]`` sorted by score, highest first."""
    state = request.app[STATE]
    params = parse_rerank(await read_json(request, state.config.payload_limit))
    if not params.texts:
        raise ApiError("Empty", "`texts` cannot be empty", metric="validation")
    if state.config.model_kind != "reranker":
        raise backend(NOT_RERANKER_MODEL)
    with admit(state, len(params.texts), is_batch=True, family="predict") as timer:
        prepared = [_prepare_pair(state, params.query, text, params.truncate, params.direction)
                    for text in params.texts]
        timer.mark_tokenized()
        outcome = await timer.run("score", prepared, items=list(params.texts),
                                  queries=[params.query] * len(prepared))
    logits = np.asarray(outcome.results, dtype=np.float32)
    scores = logits if params.raw_scores else sigmoid(logits)
    order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))
    body = []
    for i in order:
        entry: dict[str, object] = {"index": i, "score": float(scores[i])}
        if params.return_text:
            entry["text"] = params.texts[i]
        body.append(entry)
    return json_response(body, headers=outcome.headers)


async def predict(request: web.Request) -> web.Response:
    """``POST /predict`` → ``[{"score", "label"}]`` per input (``[[...]]`` for a batch)."""
    state = request.app[STATE]
    params = parse_predict(await read_json(request, state.config.payload_limit))
    if not params.inputs:
        raise ApiError("Empty", "`inputs` cannot be empty", metric="validation")
    with admit(state, len(params.inputs), is_batch=params.is_batch, family="predict") as timer:
        if state.config.model_kind != "reranker":
            raise backend(NOT_CLASSIFIER_MODEL)
        pairs = [(seq[0], seq[-1]) for seq in params.inputs]
        prepared = [_prepare_pair(state, q, t, params.truncate, params.direction) for q, t in pairs]
        timer.mark_tokenized()
        outcome = await timer.run("score", prepared, items=[q for q, _ in pairs],
                                  queries=[q for q, _ in pairs])
    logits = np.asarray(outcome.results, dtype=np.float32)
    scores = logits if params.raw_scores else sigmoid(logits)
    answers = [[{"score": float(score), "label": LABEL}] for score in scores]
    return json_response(answers if params.is_batch else answers[0], headers=outcome.headers)
