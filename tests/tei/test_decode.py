"""Decoding 200 answers: both routes give the same float32 matrix; anything else is a ValueError."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from teibatch.tei import ROUTE_EMBED, ROUTE_OPENAI_BASE64, decode_vectors

VECTORS = np.random.default_rng(0).standard_normal((5, 16)).astype(np.float32)


def openai_body(vectors: np.ndarray, order: list[int]) -> bytes:
    data = [{"object": "embedding", "index": i,
             "embedding": base64.b64encode(vectors[i].astype("<f4").tobytes()).decode()} for i in order]
    return orjson.dumps({"object": "list", "data": data, "model": "m", "usage": {}})


def test_embed_json_floats_round_trip_exactly() -> None:
    body = orjson.dumps(VECTORS, option=orjson.OPT_SERIALIZE_NUMPY)
    decoded = decode_vectors(ROUTE_EMBED, body)
    assert decoded.dtype == np.float32
    np.testing.assert_array_equal(decoded, VECTORS)


def test_base64_rows_come_back_in_index_order() -> None:
    decoded = decode_vectors(ROUTE_OPENAI_BASE64, openai_body(VECTORS, [3, 0, 4, 1, 2]))
    np.testing.assert_array_equal(decoded, VECTORS)


@pytest.mark.parametrize(("route", "body"), [
    pytest.param(ROUTE_EMBED, b"<html>bad gateway</html>", id="embed-html"),
    pytest.param(ROUTE_EMBED, b"[[1.0, 2.0], [3.0]]", id="embed-ragged"),
    pytest.param(ROUTE_EMBED, b"[1.0, 2.0]", id="embed-flat"),
    pytest.param(ROUTE_OPENAI_BASE64, b'{"data": [{"index": 0, "embedding": "AAA"}]}', id="base64-cut"),
    pytest.param(ROUTE_OPENAI_BASE64, b"[[1.0]]", id="base64-wrong-shape"),
])
def test_what_is_not_embeddings_is_a_value_error(route: str, body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_vectors(route, body)
