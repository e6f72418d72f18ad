"""Decoding 200 answers: both routes give the same float32 matrix; anything else is a ValueError
(which the client turns into a ``"bad body"`` ServerFault)."""

from __future__ import annotations

import base64

import numpy as np
import orjson
import pytest

from teibatch.tei import ROUTE_EMBED, ROUTE_OPENAI_BASE64, decode_sparse, decode_vectors

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
    pytest.param(ROUTE_EMBED, b"", id="embed-empty"),
    pytest.param(ROUTE_EMBED, b'{"error": "x", "error_type": "Backend"}', id="embed-error-object"),
    pytest.param(ROUTE_EMBED, b'[["a", "b"]]', id="embed-strings"),
    pytest.param(ROUTE_OPENAI_BASE64, b"", id="base64-empty"),
    pytest.param(ROUTE_OPENAI_BASE64, b'{"data": [{"index": 0, "embedding": [1.0, 2.0]}]}', id="base64-floats"),
    pytest.param(ROUTE_OPENAI_BASE64, b'{"data": [{"index": 0, "embedding": "AAAA!!!!AACAPw=="}]}',
                 id="base64-foreign-characters"),
    pytest.param(ROUTE_OPENAI_BASE64, b'{"data": [{"index": 0, "embedding": "AACAPw="}]}', id="base64-length"),
    pytest.param(ROUTE_OPENAI_BASE64, b'{"data": [{"index": 0, "embedding": "AACA"}]}', id="base64-not-float32"),
])
def test_what_is_not_embeddings_is_a_value_error(route: str, body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_vectors(route, body)


def test_rows_of_unequal_length_are_refused_not_reshaped() -> None:
    # 2 + 6 values make two rows of 4 if joined and reshaped: wrong vectors, so refused.
    rows = [np.ones(2, dtype=np.float32), np.ones(6, dtype=np.float32)]
    data = [{"index": i, "embedding": base64.b64encode(row.tobytes()).decode()} for i, row in enumerate(rows)]
    with pytest.raises(ValueError, match="equal-length"):
        decode_vectors(ROUTE_OPENAI_BASE64, orjson.dumps({"data": data}))


@pytest.mark.parametrize("dimension", [pytest.param(384, id="unpadded-joined"), pytest.param(1024, id="padded"),
                                       pytest.param(5, id="padded-short")])
def test_base64_rows_decode_with_and_without_padding(dimension: int) -> None:
    vectors = np.random.default_rng(dimension).standard_normal((7, dimension)).astype(np.float32)
    np.testing.assert_array_equal(decode_vectors(ROUTE_OPENAI_BASE64, openai_body(vectors, list(range(7)))), vectors)


def test_rows_of_equal_width_but_other_padding_are_refused() -> None:
    # "AAAAAA==" holds 4 bytes, "AAAAAAA=" 5: as wide, but not one float32 vector size.
    data = [{"index": 0, "embedding": "AAAAAA=="}, {"index": 1, "embedding": "AAAAAAA="}]
    with pytest.raises(ValueError, match="equal-length"):
        decode_vectors(ROUTE_OPENAI_BASE64, orjson.dumps({"data": data}))


def test_padding_inside_joined_rows_is_refused() -> None:
    # Two rows with no padding of their own but "=" inside one: not base64 of a vector.
    data = [{"index": 0, "embedding": "AACAPw=A"}, {"index": 1, "embedding": "AACAPwAA"}]
    with pytest.raises(ValueError):
        decode_vectors(ROUTE_OPENAI_BASE64, orjson.dumps({"data": data}))


@pytest.mark.parametrize("order", [pytest.param([0, 0, 1, 2, 3], id="repeated"),
                                   pytest.param([0, 1, 2, 3, 7], id="gap")])
def test_indexes_other_than_0_to_n_are_refused(order: list[int]) -> None:
    data = orjson.loads(openai_body(VECTORS, list(range(5))))
    for row, index in zip(data["data"], order, strict=True):
        row["index"] = index
    with pytest.raises(ValueError, match="indexes"):
        decode_vectors(ROUTE_OPENAI_BASE64, orjson.dumps(data))


@pytest.mark.parametrize("route, body", [pytest.param(ROUTE_EMBED, b"[]", id="embed"),
                                         pytest.param(ROUTE_OPENAI_BASE64, b'{"data": []}', id="base64")])
def test_no_vectors_is_an_empty_matrix_for_the_count_check(route: str, body: bytes) -> None:
    assert decode_vectors(route, body).shape == (0, 0)


def sparse_body(rows: list[list[tuple[int, float]]], layout: str = '{{"index":{},"value":{}}}') -> bytes:
    return ("[" + ",".join("[" + ",".join(layout.format(i, v) for i, v in row) + "]" for row in rows) + "]").encode()


@pytest.mark.parametrize("layout", [pytest.param('{{"index":{},"value":{}}}', id="teis-layout"),
                                    pytest.param('{{ "value": {1}, "index": {0} }}', id="other-key-order-and-spaces")])
def test_sparse_rows_come_back_sorted_by_index_whatever_the_layout(layout: str) -> None:
    rows = [[(7, 0.5), (2, 1.25), (30521, 3e-5)], [], [(0, 2.0)], [(9, 0.1), (4, 0.2)]]
    offsets, indices, values = decode_sparse(sparse_body(rows, layout))
    assert offsets.tolist() == [0, 3, 3, 4, 6]
    assert indices.tolist() == [2, 7, 30521, 0, 4, 9]
    np.testing.assert_array_equal(values, np.array([1.25, 0.5, 3e-5, 2.0, 0.2, 0.1], dtype=np.float32))
    assert (indices.dtype, values.dtype) == (np.int64, np.float32)


@pytest.mark.parametrize("body", [
    pytest.param(b"<html>Bad Gateway</html>", id="html"),
    pytest.param(b'[[{"index":3,"value":1.0},{"index":3,"value":2.0}]]', id="index-twice"),
    pytest.param(b'[[{"index":1.5,"value":1.0}]]', id="fractional-index"),
    pytest.param(b'[[{"index":1}]]', id="no-value"),
    pytest.param(b'[[1.0, 2.0]]', id="dense-vectors"),
    pytest.param(b'[{"index":1,"value":1.0}]', id="not-a-list-per-text"),
])
def test_what_is_not_sparse_vectors_is_a_value_error(body: bytes) -> None:
    with pytest.raises(ValueError):
        decode_sparse(body)
