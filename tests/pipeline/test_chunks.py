"""Chunks as units: ids and places, whole documents handed over, a refused chunk's document left out."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from teibatch.corpus import REJECT_UNCHUNKABLE, ChunkingOptions, Document, Reject, content_hash
from teibatch.pipeline.chunks import COUNTER_CHARS, ChunkPlan, CounterSource, RowsInOrder, Units, histogram_label
from teibatch.sink import OutputStore, VectorSchema, VectorsPart, WriteOptions
from teibatch.tei import EmbedResult
from teibatch.tei.work import Failure

CHARS = CounterSource(COUNTER_CHARS, "characters")


def plan(max_tokens: int = 10, **options: object) -> ChunkPlan:
    return ChunkPlan(ChunkingOptions(max_tokens, 0, "chars"), CHARS, **options)  # type: ignore[arg-type]


def expanded(units: Units, documents: list[Document]) -> tuple[list[tuple[int, str]], list[Document], list[Reject]]:
    record: list[Document] = []
    rejects: list[Reject] = []
    return list(units.expand(documents, record, rejects)), record, rejects


def test_each_chunk_is_a_unit_with_its_document_id_index_and_place() -> None:
    units = Units(plan(10, prefix="p:", titled=True), {"model": "m"})
    documents = [Document("a", "aaaa bbbb cccc dddd", title="T"), Document("b", "short")]
    sent, record, rejects = expanded(units, documents)
    assert record == documents and not rejects
    assert units.ids == ["a#0", "a#1", "a#2", "a#3", "b#0"]
    assert [text for _, text in sent] == ["p:T\naaaa", "p:T\nbbbb", "p:T\ncccc", "p:T\ndddd", "p:short"]
    text = documents[0].text
    assert [text[s:e] for s, e in zip(units.start[:4], units.end[:4], strict=True)] == ["aaaa", "bbbb", "cccc", "dddd"]
    assert units.doc == [0, 0, 0, 0, 1] and units.first == [0, 4]
    assert units.index == [0, 1, 2, 3, 0] and units.count == [4, 4, 4, 4, 1]
    assert units.hashes[0] == content_hash("p:T\naaaa", {"model": "m"})
    assert [units.boundary(end) for end in range(6)] == [0, 0, 0, 0, 4, 5]


def test_a_document_the_chunker_cannot_cut_is_one_unchunkable_reject() -> None:
    units = Units(plan(10, prefix="a prefix that is too long"), {})
    sent, record, rejects = expanded(units, [Document("a", "some text")])
    assert sent == [] and record == []
    assert [(r.id, r.reason) for r in rejects] == [("a", REJECT_UNCHUNKABLE)]
    assert "prefix" in rejects[0].detail


def vector(unit: int) -> np.ndarray:
    return np.array([unit + 1.0, 1.0], dtype=np.float32)


def result(units: list[int], refused: tuple[int, ...] = ()) -> EmbedResult:
    ok = np.array([u not in refused for u in units])
    failures = [Failure(i, "input_too_long", "too long") for i, u in enumerate(units) if u in refused]
    return EmbedResult(np.stack([vector(u) for u in units]), ok, failures)


@pytest.mark.parametrize("store_text", [pytest.param(False, id="no-text"), pytest.param(True, id="text")])
def test_documents_are_handed_over_whole_and_one_with_a_refused_chunk_is_left_out(tmp_path: Path,
                                                                                  store_text: bool) -> None:
    chunk_plan = plan(5, store_text=store_text, document_vector=True)
    units = Units(chunk_plan, {"model": "m"})
    documents = [Document("a", "aaaa bbbb cccc", {"lang": "x"}), Document("b", "dddd eeee", {"lang": "y"}),
                 Document("c", "ffff", {"lang": "z"})]
    sent, record, _ = expanded(units, documents)
    assert units.ids == ["a#0", "a#1", "a#2", "b#0", "b#1", "c#0"]
    schema = VectorSchema(dimension=2, kept={"lang": pa.string()}, chunks=True, chunk_text=store_text)
    reused = {1: ("whatever", vector(1), False)}  # a#1 kept from an earlier run
    with VectorsPart(schema, WriteOptions()) as part:
        rows = RowsInOrder(part, schema, record, units, reused)
        rows.add([0], result([0]))
        assert part.rows == 0  # a#2 is not back yet
        rows.add([2, 3], result([2, 3]))
        assert part.rows == 3  # a, whole; b waits for b#1
        rows.add([4, 5], result([4, 5], refused=(4,)))
        assert part.rows == 4  # b left out whole, c written
        rows.finish()
        part.commit(OutputStore(str(tmp_path)), "vectors", "s")
    table = pq.read_table(tmp_path / "vectors" / "part-s.parquet")
    assert table.column("id").to_pylist() == ["a#0", "a#1", "a#2", "c#0"]
    assert table.column("doc_id").to_pylist() == ["a", "a", "a", "c"]
    assert table.column("chunk_index").to_pylist() == [0, 1, 2, 0]
    assert table.column("chunk_count").to_pylist() == [3, 3, 3, 1]
    assert table.column("lang").to_pylist() == ["x", "x", "x", "z"]
    text = documents[0].text
    starts, ends = table.column("char_start").to_pylist(), table.column("char_end").to_pylist()
    assert [text[s:e] for s, e in zip(starts[:3], ends[:3], strict=True)] == ["aaaa", "bbbb", "cccc"]
    assert ("text" in table.column_names) is store_text
    assert rows.tally.documents == 2 and rows.tally.chunks == 4 and rows.tally.chunks_reused == 1
    assert rows.tally.tokens_embedded == 4 + 4 + 4  # a#0, a#2, c#0: characters
    assert sum(rows.tally.histogram.values()) == 4 and rows.tally.histogram[histogram_label(4)] == 4

    documents_part = pa.concat_tables(rows.document_rows)
    assert documents_part.column("id").to_pylist() == ["a", "c"]
    assert documents_part.column("chunk_count").to_pylist() == [3, 1]
    assert documents_part.column("content_hash").to_pylist() == [content_hash(d.text, {"model": "m"})
                                                                  for d in (documents[0], documents[2])]
    chunk_vectors = np.array(table.column("embedding").to_pylist())
    weights = np.array(units.tokens)[[0, 1, 2]]
    mean = (chunk_vectors[:3] * weights[:, None]).sum(axis=0)
    expected = np.stack([mean / np.linalg.norm(mean), chunk_vectors[3] / np.linalg.norm(chunk_vectors[3])])
    np.testing.assert_allclose(np.array(documents_part.column("embedding").to_pylist()), expected, rtol=1e-6)
