from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pytest

from teibatch.corpus import (
    REJECT_DUPLICATE_ID,
    REJECT_EMPTY_TEXT,
    REJECT_MALFORMED,
    REJECT_MISSING_TEXT,
    REJECT_NON_STRING_TEXT,
    CorpusOptions,
    Document,
    Reject,
    keep_field_types,
)
from teibatch.corpus.documents import DocumentRules
from teibatch.corpus.readers import Malformed
from teibatch.errors import CorpusError

RULES = DocumentRules(id_field="id", text_field="text", keep_fields=("title",))


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        pytest.param({"id": "a", "text": "hi"}, Document("a", "hi", {"title": None}), id="string-id"),
        pytest.param({"id": 7, "text": "hi"}, Document("7", "hi", {"title": None}), id="int-id"),
        pytest.param({"id": -7, "text": "hi"}, Document("-7", "hi", {"title": None}), id="negative-int-id"),
        pytest.param({"id": " a ", "text": "hi"}, Document(" a ", "hi", {"title": None}), id="string-id-as-is"),
        pytest.param({"text": "hi"}, Reject("f#3", REJECT_MALFORMED, "no id field"), id="missing-id"),
        pytest.param({"id": None, "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "null"), id="null-id"),
        pytest.param({"id": "", "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "empty string"), id="empty-id"),
        pytest.param({"id": 1.5, "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "float"), id="float-id"),
        pytest.param({"id": 2.0, "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "float"), id="integral-float-id"),
        pytest.param({"id": True, "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "bool"), id="bool-id"),
        pytest.param({"id": [1], "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "list"), id="list-id"),
        pytest.param({"id": {"a": 1}, "text": "hi"}, Reject("f#3", REJECT_MALFORMED, "dict"), id="object-id"),
        pytest.param({"id": "a"}, Reject("a", REJECT_MISSING_TEXT, ""), id="missing-text"),
        pytest.param({"id": "a", "text": 3}, Reject("a", REJECT_NON_STRING_TEXT, ""), id="number-text"),
        pytest.param({"id": "a", "text": ["x"]}, Reject("a", REJECT_NON_STRING_TEXT, ""), id="list-text"),
        pytest.param({"id": "a", "text": None}, Reject("a", REJECT_NON_STRING_TEXT, ""), id="null-text"),
        pytest.param({"id": "a", "text": ""}, Reject("a", REJECT_EMPTY_TEXT, ""), id="empty-text"),
        pytest.param({"id": "a", "text": " \n\t"}, Reject("a", REJECT_EMPTY_TEXT, ""), id="blank-text"),
        pytest.param(Malformed("f:4: bad"), Reject("f#3", REJECT_MALFORMED, "f:4: bad"), id="malformed"),
    ],
)
def test_row_to_item(row: Any, expected: Document | Reject) -> None:
    item = RULES.to_item(row, "f#3")
    if isinstance(expected, Reject):
        assert isinstance(item, Reject)
        assert (item.id, item.reason) == (expected.id, expected.reason)
        assert item.detail.startswith("f")
        assert expected.detail in item.detail
    else:
        assert item == expected
        assert item.fields == expected.fields


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("t", "t", id="string"),
        pytest.param(None, None, id="null"),
        pytest.param(3, "3", id="int"),
        pytest.param(True, "true", id="bool"),
        pytest.param({"b": [1, 2]}, '{"b":[1,2]}', id="object-compact"),
    ],
)
def test_json_keep_fields_become_strings(value: object, expected: str | None) -> None:
    item = RULES.to_item({"id": "k", "text": "x", "title": value}, "f#0")
    assert isinstance(item, Document)
    assert item.fields == {"title": expected}


def test_corpus_rejects_and_keeps_reading(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [
        {"id": "a", "text": "first"},
        {"id": "b", "text": ""},
        '{"id": "c", "text": "broken',
        {"id": "d"},
        {"id": "e", "text": 12},
        {"id": "a", "text": "again"},
        {"id": "f", "text": "last"},
    ])
    items = kit.read_all(CorpusOptions(str(path), id_field="id"))
    assert [(i.id, getattr(i, "reason", "ok")) for i in items] == [
        ("a", "ok"), ("b", REJECT_EMPTY_TEXT), ("c.jsonl#2", REJECT_MALFORMED), ("d", REJECT_MISSING_TEXT),
        ("e", REJECT_NON_STRING_TEXT), ("a", REJECT_DUPLICATE_ID), ("f", "ok"),
    ]
    malformed = items[2]
    assert isinstance(malformed, Reject)
    assert malformed.detail.startswith("c.jsonl:3: ")


def test_duplicates_are_per_shard(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [{"id": "a", "text": "x"}] * 3)
    items = kit.read_all(CorpusOptions(str(path), id_field="id", shard_docs=2))
    assert [getattr(i, "reason", "ok") for i in items] == ["ok", REJECT_DUPLICATE_ID, "ok"]


def test_undecodable_text_file_is_a_reject(kit: Any, tmp_path: Path) -> None:
    (tmp_path / "good.txt").write_text("fine")
    (tmp_path / "bad.txt").write_bytes(b"caf\xe9")
    (tmp_path / "empty.txt").write_text("  \n")
    items = kit.read_all(CorpusOptions(str(tmp_path)))
    assert [(i.id, getattr(i, "reason", "ok")) for i in items] == [
        ("bad.txt", REJECT_MALFORMED), ("empty.txt", REJECT_EMPTY_TEXT), ("good.txt", "ok"),
    ]
    assert "UTF-8" in items[0].detail


def test_csv_short_rows_miss_text_and_keep_strings(kit: Any, tmp_path: Path) -> None:
    path = kit.write_csv(tmp_path / "c.csv", ["id", "n", "text"], [["a", "1", "x"], ["b", "2"]])
    items = kit.read_all(CorpusOptions(str(path), id_field="id", keep_fields=("n", "zzz")))
    assert items[0] == Document("a", "x", {"n": "1", "zzz": None})
    assert items[0].fields == {"n": "1", "zzz": None}
    assert isinstance(items[1], Reject) and items[1].reason == REJECT_MISSING_TEXT


def test_parquet_keep_fields_stay_native(kit: Any, tmp_path: Path) -> None:
    rows = [
        {"id": 1, "text": "x", "score": 0.5, "tags": ["a"]},
        {"id": 2, "text": "y", "score": None, "tags": []},
    ]
    path = kit.write_parquet(tmp_path / "c.parquet", rows)
    options = CorpusOptions(str(path), id_field="id", keep_fields=("score", "tags", "missing"))
    items = kit.read_all(options)
    assert [(d.id, d.fields) for d in items] == [
        ("1", {"score": 0.5, "tags": ["a"], "missing": None}),
        ("2", {"score": None, "tags": [], "missing": None}),
    ]
    assert keep_field_types(options) == {
        "score": pa.float64(), "tags": pa.list_(pa.string()),
        "missing": pa.string(),
    }


def test_keep_field_types_for_row_sources_are_strings(kit: Any, tmp_path: Path) -> None:
    kit.write_jsonl(tmp_path / "a.jsonl", [{"text": "x", "n": 1}])
    (tmp_path / "b.json").write_bytes(orjson.dumps([{"text": "y"}]))
    options = CorpusOptions(str(tmp_path), keep_fields=("n",))
    assert keep_field_types(options) == {"n": pa.string()}
    assert keep_field_types(options, ["a.jsonl"]) == {"n": pa.string()}
    assert keep_field_types(CorpusOptions(str(tmp_path))) == {}


def test_keep_field_types_conflict_names_both_files(kit: Any, tmp_path: Path) -> None:
    kit.write_parquet(tmp_path / "a.parquet", [{"text": "x", "n": 1}])
    kit.write_parquet(tmp_path / "b.parquet", [{"text": "x", "n": "one"}])
    with pytest.raises(CorpusError, match=r"'n'.*a\.parquet.*b\.parquet"):
        keep_field_types(CorpusOptions(str(tmp_path), keep_fields=("n",)))


def test_keep_field_types_leave_out_a_file_that_is_not_parquet(kit: Any, tmp_path: Path) -> None:
    kit.write_parquet(tmp_path / "a.parquet", [{"text": "x", "n": 1}])
    (tmp_path / "b.parquet").write_bytes(b"not parquet")
    assert keep_field_types(CorpusOptions(str(tmp_path), keep_fields=("n",))) == {"n": pa.int64()}
