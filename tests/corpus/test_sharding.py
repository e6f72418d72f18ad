from __future__ import annotations

import dataclasses
import os
import tracemalloc
from pathlib import Path
from typing import Any

import fsspec
import pytest

from teibatch.corpus import CorpusOptions, Document, Shard, plan_shards, read_shard
from teibatch.corpus.formats import FileFormat
from teibatch.corpus.readers import iter_rows
from teibatch.errors import CorpusError, CorpusMismatch


def test_plan_is_deterministic_and_in_file_order(mixed_corpus: Path) -> None:
    options = CorpusOptions(str(mixed_corpus), id_field="id", shard_docs=2)
    first, second = plan_shards(options), plan_shards(options)
    assert first == second
    assert [(s.sources, s.start, s.stop, s.format) for s in first] == [
        (("a.jsonl",), 0, 2, "jsonl"), (("a.jsonl",), 2, 4, "jsonl"), (("a.jsonl",), 4, 5, "jsonl"),
        (("c.parquet",), 0, 2, "parquet"), (("c.parquet",), 2, 4, "parquet"),
        (("c.parquet",), 4, 6, "parquet"),
        (("notes.txt",), 0, 1, "text"),
        (("sub/b.jsonl.gz",), 0, 2, "jsonl"), (("sub/b.jsonl.gz",), 2, 3, "jsonl"),
    ]
    assert all(len(s.id) == 16 and int(s.id, 16) >= 0 for s in first)
    assert len({s.id for s in first}) == len(first)


def test_shards_together_are_the_whole_corpus_once_in_order(kit: Any, mixed_corpus: Path) -> None:
    (mixed_corpus / "b.txt").write_text("text b")
    (mixed_corpus / "d.md").write_text("text d")
    whole = kit.read_all(CorpusOptions(str(mixed_corpus), id_field="id", shard_docs=10_000))
    for shard_docs in (1, 2, 3, 4):
        items = kit.read_all(CorpusOptions(str(mixed_corpus), id_field="id", shard_docs=shard_docs))
        assert items == whole
    assert [d.id for d in whole] == [
        "a0", "a1", "a2", "a3", "a4", "b.txt", "c0", "c1", "c2", "c3", "c4", "c5", "d.md", "notes.txt",
        "b0", "b1", "b2",
    ]
    assert all(isinstance(d, Document) for d in whole)


def test_a_changed_file_changes_only_its_own_shard_ids(kit: Any, mixed_corpus: Path) -> None:
    options = CorpusOptions(str(mixed_corpus), id_field="id", shard_docs=2)
    before = {s.id: s for s in plan_shards(options)}
    kit.write_jsonl(mixed_corpus / "a.jsonl", kit.docs(5, "a", start=100))
    after = {s.id: s for s in plan_shards(options)}
    changed = {s.sources for s in before.values() if s.id not in after}
    assert changed == {("a.jsonl",)}
    assert {s.sources for s in after.values() if s.id not in before} == {("a.jsonl",)}


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"id_field": None}, id="id-field"),
        pytest.param({"text_field": "body"}, id="text-field"),
        pytest.param({"keep_fields": ("n",)}, id="keep-fields"),
        pytest.param({"format": "jsonl"}, id="format-name-same-result"),
    ],
)
def test_reading_options_are_part_of_the_id(kit: Any, tmp_path: Path, change: dict[str, Any]) -> None:
    kit.write_jsonl(tmp_path / "a.jsonl", kit.docs(3))
    options = CorpusOptions(str(tmp_path), id_field="id")
    changed = dataclasses.replace(options, **change)
    same_reading = change == {"format": "jsonl"}  # auto already read it as jsonl
    assert (plan_shards(options) == plan_shards(changed)) is same_reading


def test_text_files_are_grouped(tmp_path: Path) -> None:
    for index in range(5):
        (tmp_path / f"{index}.txt").write_text(f"text {index}")
    options = CorpusOptions(str(tmp_path), shard_docs=2)
    shards = plan_shards(options)
    assert [(s.sources, s.start, s.stop) for s in shards] == [
        (("0.txt", "1.txt"), 0, 2), (("2.txt", "3.txt"), 2, 4), (("4.txt",), 4, 5),
    ]
    read = [[d.id for d in read_shard(options, s)] for s in shards]
    assert read == [["0.txt", "1.txt"], ["2.txt", "3.txt"], ["4.txt"]]
    os.utime(tmp_path / "3.txt", (1_000_000, 1_000_000))
    assert [s.id == t.id for s, t in zip(shards, plan_shards(options), strict=True)] == [True, False, True]


def test_reading_a_shard_of_a_changed_file_refuses(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "a.jsonl", kit.docs(4))
    options = CorpusOptions(str(path), shard_docs=4)
    (shard,) = plan_shards(options)
    kit.write_jsonl(path, kit.docs(2))
    with pytest.raises(CorpusError, match="changed since"):
        list(read_shard(options, shard))
    with pytest.raises(CorpusError, match="4 rows but 2 were read"):
        list(read_shard(options, shard, verify=False))


def test_reading_a_shard_of_a_deleted_file_refuses(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "a.jsonl", kit.docs(4))
    options = CorpusOptions(str(tmp_path))
    (shard,) = plan_shards(options)
    path.unlink()
    kit.write_jsonl(tmp_path / "b.jsonl", kit.docs(4))
    with pytest.raises(CorpusError, match="gone"):
        list(read_shard(options, shard))


def test_empty_files_make_no_shards(kit: Any, tmp_path: Path) -> None:
    kit.write_jsonl(tmp_path / "empty.jsonl", [])
    kit.write_jsonl(tmp_path / "one.jsonl", kit.docs(1))
    assert [s.sources for s in plan_shards(CorpusOptions(str(tmp_path)))] == [("one.jsonl",)]


def test_shard_docs_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(CorpusError, match="shard_docs"):
        plan_shards(CorpusOptions(str(tmp_path), shard_docs=0))


def test_planning_a_large_file_holds_no_rows(tmp_path: Path) -> None:
    rows = 100_000
    line = b'{"id": "%d", "text": "a short document about nothing in particular"}\n'
    with (tmp_path / "big.jsonl").open("wb") as stream:
        for start in range(0, rows, 10_000):
            stream.write(b"".join(line % i for i in range(start, start + 10_000)))
    options = CorpusOptions(str(tmp_path / "big.jsonl"), id_field="id", shard_docs=25_000)
    tracemalloc.start()
    try:
        shards = plan_shards(options)
        last = list(read_shard(options, shards[-1]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert [s.size for s in shards] == [25_000] * 4
    assert (last[0].id, last[-1].id) == ("75000", "99999")
    assert peak < 16 * 1024 * 1024  # the file is ~7 MB; one shard's documents (~4 MB) fit well below


def test_shard_record_is_hashable_and_sized() -> None:
    shard = Shard("0" * 16, ("a.jsonl",), 10, 25, "jsonl")
    assert shard.size == 15
    assert {shard: 1}[shard] == 1


def test_text_groups_stop_at_other_files(kit: Any, tmp_path: Path) -> None:
    for name in ("a.txt", "b.txt", "d.txt"):
        (tmp_path / name).write_text(name)
    kit.write_jsonl(tmp_path / "c.jsonl", kit.docs(1))
    shards = plan_shards(CorpusOptions(str(tmp_path), shard_docs=10))
    assert [(s.sources, s.start, s.stop) for s in shards] == [
        (("a.txt", "b.txt"), 0, 2), (("c.jsonl",), 0, 1), (("d.txt",), 2, 3),
    ]


def test_a_bad_file_is_one_shard_whose_error_is_not_served_stale(kit: Any, tmp_path: Path) -> None:
    path = tmp_path / "c.csv"
    path.write_text('id,text\na,x\nb,"open\nc,y\n')
    options = CorpusOptions(str(path), id_field="id", shard_docs=1)
    (shard,) = plan_shards(options)
    assert shard.bad_file is not None and (shard.bad_file.file, shard.bad_file.line) == ("c.csv", 3)
    assert (shard.start, shard.stop) == (0, 0)
    with pytest.raises(CorpusMismatch) as caught:
        list(read_shard(options, shard))
    assert (caught.value.file, caught.value.line) == ("c.csv", 3)
    assert str(caught.value) == shard.bad_file.message
    path.write_text('id,text\na,x\nb,"closed"\nc,y\n')  # fixed after planning: plan again, not a stale error
    os.utime(path, ns=(1, 1))
    with pytest.raises(CorpusError, match="changed since") as stale:
        list(read_shard(options, shard))
    assert not isinstance(stale.value, CorpusMismatch)
    assert [s.bad_file for s in plan_shards(options)] == [None, None, None]


def awkward_jsonl(path: Path) -> bytes:
    """JSON lines with everything that makes a line not a row or a row not a document: a BOM, blank and
    whitespace lines, CRLF endings, a line that is not JSON, a byte that is not UTF-8, no final newline."""
    data = (b'\xef\xbb\xbf{"id": "r0", "text": "first"}\n\n   \n{"id": "r1", "text": "second"}\r\n'
            b'not json\n{"id": "r3", "text": "bad \xff byte"}\n\t\n{"id": "r4", "text": "fourth"}\n'
            b'{"id": "r5", "text": "fifth"}\n\n{"id": "r6", "text": "sixth"}')
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


@pytest.mark.parametrize("shard_docs", [1, 2, 3, 5])
def test_a_marked_shard_reads_what_reading_from_the_start_reads(tmp_path: Path, shard_docs: int) -> None:
    awkward_jsonl(tmp_path / "c" / "a.jsonl")
    options = CorpusOptions(str(tmp_path / "c"), id_field="id", shard_docs=shard_docs)
    shards = plan_shards(options)
    assert [s.mark.row if s.mark is not None else None for s in shards] == [s.start for s in shards]
    for shard in shards:
        marked = list(read_shard(options, shard))
        assert marked == list(read_shard(options, dataclasses.replace(shard, mark=None)))
        assert len(marked) == shard.size
    rejects = [item for shard in shards for item in read_shard(options, shard) if not isinstance(item, Document)]
    assert [r.detail.split(":")[0] for r in rejects] == ["a.jsonl#2 (line 5)", "a.jsonl#3 (line 6)"]


def test_reading_starts_at_the_mark(tmp_path: Path) -> None:
    data = awkward_jsonl(tmp_path / "c" / "a.jsonl")
    options = CorpusOptions(str(tmp_path / "c"), id_field="id", shard_docs=2)
    shard = plan_shards(options)[2]  # rows 4 and 5
    assert shard.mark is not None and (shard.mark.row, shard.mark.line) == (4, 7)  # row 4 is on line 8
    assert data[shard.mark.offset:].startswith(b'{"id": "r4"')
    # A mark for row 4 that points at row 5's bytes: the reader seeks there and reads what it finds.
    later = dataclasses.replace(shard.mark, offset=data.index(b'{"id": "r5"'))
    rows = list(iter_rows(fsspec.filesystem("file"), str(tmp_path / "c" / "a.jsonl"), FileFormat("jsonl"), "a.jsonl",
                          4, 6, mark=later))
    assert [(number, row["id"]) for number, _, row in rows] == [(4, "r5"), (5, "r6")]


def test_only_uncompressed_json_lines_are_marked(mixed_corpus: Path) -> None:
    shards = plan_shards(CorpusOptions(str(mixed_corpus), id_field="id", shard_docs=2))
    assert {s.sources[0]: s.mark is not None for s in shards} == {
        "a.jsonl": True, "c.parquet": False, "notes.txt": False, "sub/b.jsonl.gz": False}
