"""TEI's error answers, byte for byte: JSON errors, OpenAI-route errors and axum's plain-text rejections.

Handlers raise :class:`ApiError` (TEI's ``ErrorResponse``: ``{"error", "error_type"}``, PascalCase
types) or :class:`Rejection` (what axum's extractors answer on their own: text/plain, no JSON).
One place renders them, so TEI's error-type-to-status table (``From<&ErrorType> for StatusCode`` in
TEI's ``router/src/http/server.rs``) lives here and nowhere else.
"""

from __future__ import annotations

from typing import Any

import orjson
from aiohttp import web

STATUS_OF = {
    "Unhealthy": 503,
    "Backend": 424,
    "Overloaded": 429,
    "Tokenizer": 422,
    "Validation": 422,
    "Empty": 400,
}

PAYLOAD_TOO_LARGE = "Failed to buffer the request body: length limit exceeded"
MISSING_JSON_CONTENT_TYPE = "Expected request with `Content-Type: application/json`"
JSON_SYNTAX_PREFIX = "Failed to parse the request body as JSON: "
JSON_DATA_PREFIX = "Failed to deserialize the JSON body into the target type: "
OVERLOADED = "Model is overloaded"
NOT_EMBEDDING_MODEL = "Backend error: Model is not an embedding model"
NOT_RERANKER_MODEL = "Backend error: model is not a re-ranker model"
NOT_CLASSIFIER_MODEL = "Backend error: Model is not a classifier model"
NOT_SPLADE_MODEL = "Backend error: Model is not an embedding model with SPLADE pooling"
SPLADE_NO_NORMALIZE = "Backend error: `normalize` is not available for SPLADE models"
SPLADE_NO_EMBED_ALL = "Backend error: `embed_all` is not available for SPLADE models"


class ApiError(Exception):
    """A TEI JSON error: ``error_type`` is one of :data:`STATUS_OF`'s keys, ``message`` the exact text.

    ``metric`` is the ``err`` label of ``te_request_failure`` it counts under (None: not counted);
    ``violation`` the ``teibatch_violation_total`` kind when the client broke a limit.
    """

    def __init__(self, error_type: str, message: str, *, metric: str | None = None,
                 violation: str | None = None) -> None:
        super().__init__(message)
        self.error_type = error_type
        self.message = message
        self.status = STATUS_OF[error_type]
        self.metric = metric
        self.violation = violation

    def response(self, *, openai: bool = False) -> web.Response:
        """The JSON body TEI sends; the OpenAI routes use ``{"message", "code", "type"}``."""
        if openai:
            body: dict[str, Any] = {"message": self.message, "code": self.status, "type": self.error_type}
        else:
            body = {"error": self.message, "error_type": self.error_type}
        return json_response(body, status=self.status)


class Rejection(Exception):
    """An answer axum gives before TEI's handler runs: a status with a text/plain body (maybe empty)."""

    def __init__(self, status: int, text: str) -> None:
        super().__init__(text)
        self.status = status
        self.text = text

    def response(self) -> web.Response:
        """text/plain with ``charset=utf-8`` like axum; an empty text gives an empty body, no type."""
        if not self.text:
            return web.Response(status=self.status)
        return web.Response(status=self.status, text=self.text, content_type="text/plain")


def json_response(body: Any, *, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    """``application/json`` without a charset parameter, as axum's ``Json`` sends it."""
    return web.Response(body=orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), status=status,
                        content_type="application/json", headers=headers)


def validation(message: str, *, violation: str | None = None) -> ApiError:
    """422 Validation with TEI's ``Input validation error: `` prefix."""
    return ApiError("Validation", f"Input validation error: {message}", metric="validation",
                    violation=violation)


def empty(message: str) -> ApiError:
    """400 Empty with TEI's ``Input validation error: `` prefix (tokenization of an empty input)."""
    return ApiError("Empty", f"Input validation error: {message}", metric="validation")


def batch_size(given: int, maximum: int) -> ApiError:
    """422 for more inputs than ``--max-client-batch-size`` (no prefix: raised in server.rs)."""
    return ApiError("Validation", f"batch size {given} > maximum allowed batch size {maximum}",
                    metric="batch_size", violation="batch_size")


def overloaded(*, violation: str | None = "inflight") -> ApiError:
    """429 when the per-input concurrency permits are exhausted (an ``inflight`` violation)."""
    return ApiError("Overloaded", OVERLOADED, metric="overloaded", violation=violation)


def backend(message: str, *, metric: str = "model_type") -> ApiError:
    """424 Backend; ``message`` is the full text, ``Backend error: `` prefix included."""
    return ApiError("Backend", message, metric=metric)


def data_error(path: str, message: str) -> Rejection:
    """422 text/plain like serde_path_to_error: ``{path}: {message}``, the path left out at the root."""
    detail = f"{path}: {message}" if path and path != "." else message
    return Rejection(422, JSON_DATA_PREFIX + detail)
