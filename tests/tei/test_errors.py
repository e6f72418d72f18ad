"""TEI's answers (docs/client.md, "What each answer leads to") map to teibatch's error types."""

from __future__ import annotations

import orjson
import pytest

from teibatch.errors import (
    InputTooLong,
    PayloadTooLarge,
    TeiAuthError,
    TeiError,
    TeiOverloaded,
    TeiRequestError,
    TeiUnavailable,
    TooManyInputs,
    WrongModelKind,
)
from teibatch.tei.client import error_from_response


def tei(error: str, error_type: str) -> bytes:
    return orjson.dumps({"error": error, "error_type": error_type})


@pytest.mark.parametrize(("status", "body", "kind", "retryable"), [
    pytest.param(401, b"", TeiAuthError, False, id="401-empty"),
    pytest.param(429, tei("Model is overloaded", "Overloaded"), TeiOverloaded, True, id="429"),
    pytest.param(413, b"Failed to buffer the request body: length limit exceeded", PayloadTooLarge, False,
                 id="413-plain-text"),
    pytest.param(422, tei("batch size 40 > maximum allowed batch size 32", "Validation"), TooManyInputs, False,
                 id="422-batch-size"),
    pytest.param(413, tei("batch size 40 > maximum allowed batch size 32", "Validation"), TooManyInputs, False,
                 id="413-batch-size-before-1.9"),
    pytest.param(422, tei("Input validation error: `inputs` must have less than 512 tokens. Given: 900",
                          "Validation"), InputTooLong, False, id="422-too-many-tokens"),
    pytest.param(413, tei("Input validation error: `inputs` must have less than 512 tokens. Given: 900",
                          "Validation"), InputTooLong, False, id="413-too-many-tokens-before-1.9"),
    pytest.param(424, tei("Backend error: Model is not an embedding model", "Backend"), WrongModelKind, False,
                 id="424-reranker"),
    pytest.param(424, tei("Backend error: CUDA out of memory", "Backend"), TeiUnavailable, True,
                 id="424-backend-failure"),
    pytest.param(503, tei("unhealthy", "Unhealthy"), TeiUnavailable, True, id="503"),
    pytest.param(500, b"boom", TeiUnavailable, True, id="500"),
    pytest.param(400, tei("Input validation error: `inputs` cannot be empty", "Empty"), TeiRequestError, False,
                 id="400-empty"),
    pytest.param(422, b"Failed to deserialize the JSON body into the target type: inputs", TeiRequestError,
                 False, id="422-axum-plain"),
])
def test_status_and_body_map_to_types(status: int, body: bytes, kind: type[TeiError], retryable: bool) -> None:
    error = error_from_response("http://127.0.0.1:9", status, body)
    assert type(error) is kind
    assert error.status_code == status
    assert error.server == "http://127.0.0.1:9"
    assert error.retryable is retryable
    assert str(error).startswith("http://127.0.0.1:9: ")


def test_retry_after_is_read() -> None:
    error = error_from_response("http://s", 429, tei("Model is overloaded", "Overloaded"), "1.5")
    assert error.retry_after == 1.5


def test_openai_error_shape() -> None:
    body = orjson.dumps({"message": "Model is overloaded", "code": 429, "type": "Overloaded"})
    assert isinstance(error_from_response("http://s", 429, body), TeiOverloaded)
