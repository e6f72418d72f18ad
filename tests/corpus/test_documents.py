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
from teibatch.corpus.rows import Place
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
        pytest.param({"id": "a", "text": "\u3000\u2028\x1c"}, Reject("a", REJECT_EMPTY_TEXT, ""), id="unicode-blank"),
        pytest.param(Malformed("f:4: bad"), Reject("f#3", REJECT_MALFORMED, "f:4: bad"), id="malformed"),
    ],
)
def test_row_to_item(row: Any, expected: Document | Reject) -> None:
    item = RULES.to_item(row, Place("f", 3))
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
    item = RULES.to_item({"id": "k", "text": "x", "title": value}, Place("f", 0))
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
    assert malformed.detail.startswith("c.jsonl#2 (line 3): ")


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


def test_integer_and_string_ids_collide_naming_both_lines_and_types(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [{"id": 1, "text": "one"}, {"id": "1", "text": "the string one"},
                                                  {"id": "a", "text": "x"}, {"id": "a", "text": "y"}])
    items = kit.read_all(CorpusOptions(str(path), id_field="id"))
    assert [(i.id, getattr(i, "reason", "ok")) for i in items] == [
        ("1", "ok"), ("1", REJECT_DUPLICATE_ID), ("a", "ok"), ("a", REJECT_DUPLICATE_ID)]
    assert items[1].detail == ('c.jsonl#1 (line 2): id "1" (string, line 2) collides with integer 1 (line 1): '
                               "integer ids are written as decimal strings")
    assert "(line 4)" in items[3].detail and "(line 3)" in items[3].detail  # a plain duplicate names both lines
    assert "integer" not in items[3].detail


def test_a_line_with_invalid_unicode_is_rejected_under_its_own_id_and_one_numbering(kit: Any, tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl"
    path.write_bytes(b'{"id": "fine", "text": "ok"}\n\n'
                     b'{"id": "lone", "text": "half a pair \\ud800 here"}\n'
                     b'{"id": "bytes", "text": "caf\xe9"}\n'
                     b'{"id": "\\udc00", "text": "bad id too"}\n'
                     b'{"id": "broken", "text": \n')
    items = kit.read_all(CorpusOptions(str(path), id_field="id"))
    assert [(i.id, getattr(i, "reason", "ok")) for i in items] == [
        ("fine", "ok"), ("lone", REJECT_MALFORMED), ("bytes", REJECT_MALFORMED), ("c.jsonl#3", REJECT_MALFORMED),
        ("c.jsonl#4", REJECT_MALFORMED)]
    assert items[1].detail.startswith("c.jsonl#1 (line 3): field 'text' holds text that is not valid Unicode")
    assert items[2].detail.startswith("c.jsonl#2 (line 4): field 'text'")
    assert items[3].detail.startswith("c.jsonl#3 (line 5): ") and items[4].detail.startswith("c.jsonl#4 (line 6): ")
    # without an id field, the reject's id and its detail carry the same row number
    positional = kit.read_all(CorpusOptions(str(path)))
    assert positional[1].id == "c.jsonl#1" and positional[1].detail.startswith("c.jsonl#1 (line 3): ")


def test_dotted_paths_reach_into_json_objects_and_parquet_structs(kit: Any, tmp_path: Path) -> None:
    rows = [{"meta": {"id": i, "tags": {"lang": "en"}}, "doc": {"body": f"text {i}", "title": f"T{i}"},
             "doc.title": f"literal {i}"} for i in range(3)]
    kit.write_jsonl(tmp_path / "j" / "c.jsonl", rows)
    kit.write_parquet(tmp_path / "p" / "c.parquet", rows)
    for folder in ("j", "p"):
        options = CorpusOptions(str(tmp_path / folder), id_field="meta.id", text_field="doc.body",
                                keep_fields=("doc.title", "meta.tags.lang", "doc"))
        items = kit.read_all(options)
        assert [i.id for i in items] == ["0", "1", "2"], folder
        assert items[1] == Document("1", "text 1", {"doc.title": "literal 1", "meta.tags.lang": "en",
                                                    "doc": items[1].fields["doc"]})
        assert items[1].fields["doc.title"] == "literal 1", "a literal key with a dot wins over the nested one"
        assert items[1].fields["meta.tags.lang"] == "en"
    missing = kit.read_all(CorpusOptions(str(tmp_path / "j"), text_field="doc.summary"))
    assert {getattr(i, "reason", "ok") for i in missing} == {REJECT_MISSING_TEXT}


PLAIN_ROWS: list[Any] = [
    {"id": "a", "text": "hello"}, {"id": 7, "text": "x"}, {"id": -3, "text": " y "},
    {"id": True, "text": "x"}, {"id": 1.0, "text": "x"}, {"id": "", "text": "x"}, {"id": None, "text": "x"},
    {"id": [1], "text": "x"}, {"text": "x"}, {"id": "a"}, {"id": "a", "text": ""}, {"id": "a", "text": " \n"},
    {"id": "a", "text": None}, {"id": "a", "text": 5}, {"id": "a", "text": ["x"]},
    {"doc": {"id": "n"}, "text": "x"}, {"doc.id": "lit", "doc": {"id": "n"}, "text": "x"},
    Malformed("f.jsonl#0 (line 1): bad"), Malformed("f.jsonl#0 (line 1): bad", {"id": "a", "text": "x"}),
]


@pytest.mark.parametrize("id_field", ["id", "doc.id"])
@pytest.mark.parametrize("row", PLAIN_ROWS, ids=range(len(PLAIN_ROWS)))
def test_the_plain_way_decides_a_row_as_the_full_rules_do(row: Any, id_field: str) -> None:
    """What ``plain`` accepts, ``to_item`` makes the same document of, with the same integer flag;
    what it leaves, the full rules decide (rejects, nested paths)."""
    rules = DocumentRules(id_field, "text", ())
    assert rules.quick
    place = Place("f.jsonl", 0, 1)
    plain = rules.plain(row)
    if plain is not None:
        item = rules.to_item(row, place)
        assert isinstance(item, Document)
        assert (item.id, item.text, rules.integer_id(row)) == plain


def test_the_plain_way_takes_the_common_rows() -> None:
    rules = DocumentRules("id", "text", ())
    assert rules.plain({"id": "a", "text": "hello", "other": 1}) == ("a", "hello", False)
    assert rules.plain({"id": 7, "text": "x"}) == ("7", "x", True)
    assert rules.plain({"id": True, "text": "x"}) is None
    assert not DocumentRules("id", "text", ("kept",)).quick
    assert not DocumentRules(None, "text", ()).quick
    assert not DocumentRules("id", "text", (), title_field="title").quick
