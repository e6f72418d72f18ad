"""Bad input files are findings, not silent merges (issue #12), at the corpus level.

One test per bad-input case, each on real files in ``tmp_path``: a CSV quote that never closes, a
truncated gzip file among good ones, and ids of every type. The end-to-end checks (a run's exit
code, its report) live with the pipeline tests; these pin down what ``probe_corpus``,
``plan_shards`` and ``read_shard`` do, which is what the run builds on.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from teibatch.corpus import (
    REJECT_MALFORMED,
    CorpusOptions,
    Document,
    Reject,
    plan_shards,
    probe_corpus,
    read_shard,
)
from teibatch.errors import CorpusMismatch
from tests.conftest import write_jsonl

pytestmark = pytest.mark.timeout(60)


def read_plan(options: CorpusOptions) -> tuple[list[Document | Reject], list[CorpusMismatch]]:
    """Every shard read in plan order, as a run would: a shard that fails does not stop the others."""
    items: list[Document | Reject] = []
    failures: list[CorpusMismatch] = []
    for shard in plan_shards(options):
        try:
            items += list(read_shard(options, shard))
        except CorpusMismatch as exc:
            failures.append(exc)
    return items, failures


def csv_with_stray_quote(path: Path, rows: int = 1001, bad_row: int = 11) -> Path:
    lines = ["id,text"] + [f"r{i},document {i}" for i in range(1, rows + 1)]
    lines[bad_row] = f'r{bad_row},"document {bad_row} opens a quote'
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_csv_quote_that_never_closes_stops_with_file_and_line(tmp_path: Path) -> None:
    # before: 11 vectors, 0 rejects, rows 11..1001 absorbed into one document's text
    csv_with_stray_quote(tmp_path / "docs.csv")
    write_jsonl(tmp_path / "other.jsonl", [{"id": f"o{i}", "text": f"other {i}"} for i in range(30)])
    options = CorpusOptions(str(tmp_path), id_field="id", shard_docs=100)

    with pytest.raises(CorpusMismatch) as probed:
        probe_corpus(options)
    assert (probed.value.file, probed.value.line) == ("docs.csv", 12)

    items, failures = read_plan(options)
    assert [(f.file, f.line, f.exit_code) for f in failures] == [("docs.csv", 12, 2)]
    assert "never closes" in str(failures[0]) and "on_bad_file: reject" in str(failures[0])
    assert [item.id for item in items] == [f"o{i}" for i in range(30)]  # the other file is read in full
    assert not any(len(item.text) > 100 for item in items if isinstance(item, Document))


def test_csv_quote_that_never_closes_rejects_the_rest_when_asked(tmp_path: Path) -> None:
    path = csv_with_stray_quote(tmp_path / "docs.csv")
    for shard_docs in (100, 10_000):
        options = CorpusOptions(str(path), id_field="id", shard_docs=shard_docs, on_bad_file="reject")
        items, failures = read_plan(options)
        assert failures == []
        documents = [item for item in items if isinstance(item, Document)]
        rejects = [item for item in items if isinstance(item, Reject)]
        assert [d.id for d in documents] == [f"r{i}" for i in range(1, 11)]
        assert (len(rejects), {r.reason for r in rejects}) == (991, {REJECT_MALFORMED})
        assert rejects[0].detail.startswith("docs.csv#10 (line 12): ")
        assert rejects[-1].detail.startswith("docs.csv#1000 (line 1002): ")


def test_legitimate_multi_line_csv_cells_are_not_refused(tmp_path: Path) -> None:
    lines = ["id,text"] + [f'r{i},"line one of {i}\nline two, with ""quotes""\n"' for i in range(500)]
    (tmp_path / "docs.csv").write_text("\n".join(lines) + "\n", encoding="utf-8")
    items, failures = read_plan(CorpusOptions(str(tmp_path), id_field="id", shard_docs=64))
    assert failures == []
    assert [item.text for item in items] == [f'line one of {i}\nline two, with "quotes"\n' for i in range(500)]


def _gzip_jsonl(path: Path, prefix: str, count: int) -> bytes:
    data = gzip.compress(b"".join(f'{{"id": "{prefix}{i}", "text": "{prefix} {i}"}}\n'.encode()
                                  for i in range(count)))
    path.write_bytes(data)
    return data


def test_truncated_gzip_fails_its_shard_only_and_a_rerun_after_the_fix_completes(tmp_path: Path) -> None:
    _gzip_jsonl(tmp_path / "a.jsonl.gz", "a", 250)
    good_b = _gzip_jsonl(tmp_path / "b.jsonl.gz", "b", 5000)
    _gzip_jsonl(tmp_path / "c.jsonl.gz", "c", 250)
    (tmp_path / "b.jsonl.gz").write_bytes(good_b[: len(good_b) // 2])  # cut off mid-stream
    options = CorpusOptions(str(tmp_path), id_field="id", shard_docs=100)

    before = plan_shards(options)
    items, failures = read_plan(options)
    assert [(f.file, f.exit_code) for f in failures] == [("b.jsonl.gz", 2)]
    assert failures[0].line is not None and "truncated" in str(failures[0])
    assert len(items) == 500 and {item.id[0] for item in items} == {"a", "c"}

    (tmp_path / "b.jsonl.gz").write_bytes(good_b)  # the file is fixed
    after = plan_shards(options)
    items, failures = read_plan(options)
    assert failures == [] and len(items) == 5500
    unchanged = {s.id for s in before if s.sources[0] != "b.jsonl.gz"}
    assert unchanged <= {s.id for s in after}  # the good files' shards stay committed across the fix
    assert not {s.id for s in before if s.sources[0] == "b.jsonl.gz"} & {s.id for s in after}


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        pytest.param("doc-1", "doc-1", id="string-kept"),
        pytest.param(12345, "12345", id="int-as-decimal"),
        pytest.param("", "empty string", id="empty-string"),
        pytest.param(None, "null", id="null"),
        pytest.param(True, "bool", id="bool"),
        pytest.param(1.5, "float", id="float"),
        pytest.param(["a"], "list", id="list"),
        pytest.param({"a": 1}, "dict", id="object"),
    ],
)
def test_one_id_rule_for_json_lines(tmp_path: Path, value: object, expected: str) -> None:
    write_jsonl(tmp_path / "c.jsonl", [{"id": value, "text": "some text"}])
    items, _ = read_plan(CorpusOptions(str(tmp_path), id_field="id"))
    (item,) = items
    if isinstance(value, str | int) and value != "" and not isinstance(value, bool):
        assert item == Document(expected, "some text")
    else:
        assert isinstance(item, Reject)
        assert (item.id, item.reason) == ("c.jsonl#0", REJECT_MALFORMED)
        assert expected in item.detail and "'id'" in item.detail


def test_id_rule_for_missing_field_csv_and_parquet_and_positional_ids(tmp_path: Path) -> None:
    write_jsonl(tmp_path / "a.jsonl", [{"text": "no id here"}, {"id": "x", "text": "has one"}])
    (tmp_path / "b.csv").write_text("id,text\n,empty id cell\n7,seven\n", encoding="utf-8")
    pq.write_table(pa.table({"id": pa.array([1, None], pa.int64()), "text": ["one", "null id"]}),
                   tmp_path / "c.parquet")
    items, _ = read_plan(CorpusOptions(str(tmp_path), id_field="id"))
    assert [(item.id, getattr(item, "reason", "ok")) for item in items] == [
        ("a.jsonl#0", REJECT_MALFORMED), ("x", "ok"),
        ("b.csv#0", REJECT_MALFORMED), ("7", "ok"),
        ("1", "ok"), ("c.parquet#1", REJECT_MALFORMED),
    ]
    assert "no id field 'id'" in items[0].detail
    # positional ids only when the job names no id field
    positional, _ = read_plan(CorpusOptions(str(tmp_path)))
    assert [item.id for item in positional] == ["a.jsonl#0", "a.jsonl#1", "b.csv#0", "b.csv#1",
                                                "c.parquet#0", "c.parquet#1"]
