"""Kept-field types: decided once from the probe's sample and the Parquet columns, then checked per value."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from teibatch.corpus import CorpusOptions, Document, KeptFields, plan_shards, probe_corpus, read_shard
from teibatch.corpus.kept import check_columns, decide_kept_fields, merge, type_of
from teibatch.errors import CorpusMismatch

VALUES = {"n": 5, "x": 1.5, "flag": True, "tags": [1, 2], "meta": {"a": 1, "b": "s"}, "title": "t"}


def decided(options: CorpusOptions, rule: str = "strict") -> tuple[KeptFields, list[Any]]:
    probe = probe_corpus(options)
    return decide_kept_fields(options, rule, probe.kept, probe.sample_file)


def read(options: CorpusOptions, kept: KeptFields) -> list[Any]:
    return [item for shard in plan_shards(options) for item in read_shard(options, shard, kept=kept)]


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        pytest.param([1, 2], pa.int64(), id="ints"),
        pytest.param([1, 2.5], pa.float64(), id="ints-and-floats"),
        pytest.param([None, True], pa.bool_(), id="null-fits"),
        pytest.param([[1], [], [2.5]], pa.list_(pa.float64()), id="lists"),
        pytest.param([{"a": 1}, {"b": "x"}], pa.struct([("a", pa.int64()), ("b", pa.string())]), id="structs"),
        pytest.param([1, "1"], None, id="int-and-string"),
        pytest.param([[1, "a"]], None, id="mixed-list"),
    ],
)
def test_the_type_values_share(values: list[Any], expected: pa.DataType | None) -> None:
    merged = pa.null()
    for value in values:
        merged = merge(merged, type_of(value))
    assert merged == expected if expected is not None else not isinstance(merged, pa.DataType)


def test_strict_keeps_native_types_and_stringifies_a_field_whose_values_disagree(kit: Any, tmp_path: Path) -> None:
    rows = [{"id": str(i), "text": f"t{i}", **VALUES, "mixed": i if i % 2 else f"s{i}", "empty": None}
            for i in range(4)]
    path = kit.write_jsonl(tmp_path / "c.jsonl", rows)
    options = CorpusOptions(str(path), id_field="id", keep_fields=(*VALUES, "mixed", "empty"))
    kept, stringified = decided(options)
    assert kept.types == {"n": pa.int64(), "x": pa.float64(), "flag": pa.bool_(), "tags": pa.list_(pa.int64()),
                          "meta": pa.struct([("a", pa.int64()), ("b", pa.string())]), "title": pa.string(),
                          "mixed": pa.string(), "empty": pa.string()}
    assert kept.stringified == {"mixed"}
    assert [s.field for s in stringified] == ["mixed"]
    assert "'mixed'" in stringified[0].message() and "string, int64 in c.jsonl" in stringified[0].message()
    first = read(options, kept)[1]
    assert isinstance(first, Document)
    assert first.fields == {**VALUES, "mixed": "1", "empty": None}
    assert KeptFields.from_json(kept.to_json()) == kept
    assert KeptFields.from_json(kept.to_json()).types == kept.types


def test_stringify_is_the_old_rule(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", [{"text": "x", **VALUES}])
    options = CorpusOptions(str(path), keep_fields=tuple(VALUES))
    kept, stringified = decided(options, "stringify")
    assert (set(kept.types.values()), kept.stringified, stringified) == ({pa.string()}, set(VALUES), [])
    (document,) = read(options, kept)
    assert document.fields == {"n": "5", "x": "1.5", "flag": "true", "tags": "[1,2]", "meta": '{"a":1,"b":"s"}',
                               "title": "t"}


@pytest.mark.parametrize(
    ("value", "words"),
    [
        pytest.param("five", "holds a string ('five'), but the output's column 'n' is int64", id="string-in-int"),
        pytest.param(2.5, "holds a float (2.5), but the output's column 'n' is int64", id="float-in-int"),
        pytest.param(True, "holds a boolean (true)", id="bool-in-int"),
    ],
)
def test_a_later_value_that_does_not_fit_stops_the_shard(kit: Any, tmp_path: Path, value: Any, words: str) -> None:
    rows = [{"id": str(i), "text": "t", "n": i} for i in range(150)]
    rows[120]["n"] = value  # past the probe's sample of 100 records
    path = kit.write_jsonl(tmp_path / "c.jsonl", rows)
    options = CorpusOptions(str(path), id_field="id", keep_fields=("n",))
    kept, _ = decided(options)
    with pytest.raises(CorpusMismatch, match=re.escape(words)) as caught:
        read(options, kept)
    error = caught.value
    assert (error.file, error.line, error.field, error.exit_code) == ("c.jsonl", 121, "n", 2)
    assert str(error).startswith("c.jsonl:121: ") and "keep_fields_types: stringify" in str(error)


def test_struct_values_must_fit_their_members(kit: Any, tmp_path: Path) -> None:
    rows = [{"text": "t", "m": {"a": 1}}] * 3 + [{"text": "t", "m": {"a": 1, "extra": 2}}]
    path = kit.write_jsonl(tmp_path / "c.jsonl", rows)
    options = CorpusOptions(str(path), keep_fields=("m",))
    kept = KeptFields("strict", {"m": pa.struct([("a", pa.int64())])})
    with pytest.raises(CorpusMismatch, match=r"an object with a key 'extra' that the column has not") as caught:
        read(options, kept)
    assert caught.value.line == 4


def test_parquet_columns_join_the_decision_and_are_checked_against_a_recorded_one(kit: Any, tmp_path: Path) -> None:
    kit.write_parquet(tmp_path / "a.parquet", [{"text": "x", "n": 1, "s": "a"}])
    kit.write_parquet(tmp_path / "b.parquet", [{"text": "x", "n": 2.5, "s": 3}])
    options = CorpusOptions(str(tmp_path), keep_fields=("n", "s"))
    kept, stringified = decided(options)
    assert (kept.types, kept.stringified) == ({"n": pa.float64(), "s": pa.string()}, {"s"})
    assert stringified[0].seen == ("string in a.parquet", "int64 in b.parquet")
    check_columns(kept, options)
    recorded = KeptFields("strict", {"n": pa.int64(), "s": pa.string()}, frozenset({"s"}))
    with pytest.raises(CorpusMismatch, match=r"column 'n' is float64, but this output's kept field 'n' is int64"):
        check_columns(recorded, options)
