from __future__ import annotations

import io

import orjson
import pytest

from teibatch.corpus.jsonarray import iter_array_items
from teibatch.errors import CorpusError

TRICKY = [
    {"id": 1, "text": 'brackets ] } [ { and "quotes" and \\ backslash, commas'},
    {"id": 2, "text": "nested", "meta": {"tags": ["a", ["b"]], "o": {"x": [1, 2]}}},
    {"id": 3, "text": "unicode \u00e9\u4e2d\U0001f600 \\\" end"},
]


def split(data: bytes, chunk: int = 1 << 20) -> list[object]:
    return [orjson.loads(item) for item in iter_array_items(io.BytesIO(data), "f.json", chunk=chunk)]


@pytest.mark.parametrize("chunk", [pytest.param(1, id="1-byte-chunks"), pytest.param(7, id="7-byte-chunks"),
                                   pytest.param(1 << 20, id="one-chunk")])
@pytest.mark.parametrize(
    "document",
    [
        pytest.param(TRICKY, id="array"),
        pytest.param({"version": 1, "docs": TRICKY, "meta": {"lists": [[1]]}}, id="object-with-one-list"),
    ],
)
def test_elements_survive_any_chunking(document: object, chunk: int) -> None:
    assert split(orjson.dumps(document, option=orjson.OPT_INDENT_2), chunk) == TRICKY


def test_empty_array_and_malformed_element_are_split_not_parsed() -> None:
    assert split(b" [ ] ") == []
    items = list(iter_array_items(io.BytesIO(b'[{"a": 1}, {"b": }, 3]'), "f.json"))
    assert items == [b'{"a": 1}', b'{"b": }', b"3"]


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(b"", "empty JSON file", id="empty"),
        pytest.param(b'"text"', "array or an object", id="scalar"),
        pytest.param(b'{"a": [1], "b": [2]}', "more than one list", id="two-lists"),
        pytest.param(b'{"a": 1}', "no list", id="no-list"),
        pytest.param(b"[1, 2", "ends before", id="unclosed"),
        pytest.param(b'[1, "abc', "inside a string", id="unclosed-string"),
        pytest.param(b"[1, 2}", "unbalanced", id="unbalanced"),
    ],
)
def test_structure_errors(data: bytes, message: str) -> None:
    with pytest.raises(CorpusError, match=message):
        list(iter_array_items(io.BytesIO(data), "f.json"))
