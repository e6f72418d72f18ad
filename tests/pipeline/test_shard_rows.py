"""A shard's vectors reach its part in document order, each document as soon as it is final."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from teibatch.corpus import Document
from teibatch.pipeline.chunks import RowsInOrder, Units
from teibatch.sink import OutputStore, VectorSchema, VectorsPart, WriteOptions
from teibatch.tei import EmbedResult
from teibatch.tei.work import Failure


def units_of(documents: list[Document], hashes: list[str]) -> Units:
    """One unit per document (no chunking), with the given content hashes."""
    units = Units(None, {})
    for _ in units.expand(documents, [], []):
        pass
    units.hashes[:] = hashes
    return units


def vector(position: int) -> np.ndarray:
    return np.full(2, position, dtype=np.float32)


def result(positions: list[int], rejected: tuple[int, ...] = ()) -> EmbedResult:
    ok = np.array([p not in rejected for p in positions])
    failures = [Failure(i, "too_long", "") for i, p in enumerate(positions) if p in rejected]
    return EmbedResult(np.stack([vector(p) for p in positions]), ok, failures, np.array([p == 6 for p in positions]))


def test_embedded_and_reused_documents_are_handed_over_in_order_as_they_become_final(tmp_path: Path) -> None:
    schema = VectorSchema(dimension=2, kept={"lang": pa.string()})
    documents = [Document(f"d{p}", f"text {p}", {"lang": f"l{p}"}) for p in range(8)]
    hashes = [f"h{p}" for p in range(8)]
    reused = {p: (hashes[p], vector(p), p == 4) for p in (0, 3, 4, 7)}  # vectors kept from an earlier run
    with VectorsPart(schema, WriteOptions()) as part:
        rows = RowsInOrder(part, schema, documents, units_of(documents, hashes), reused)
        rows.add([1, 2], result([1, 2], rejected=(2,)))
        assert part.rows == 2  # d0 (reused, before d1) and d1; d2 was rejected
        rows.add([5, 6], result([5, 6]))
        assert part.rows == 6  # d3 and d4 were waiting for d5's chunk
        rows.finish()
        assert part.rows == 7  # the reused d7, after the last embedded one
        relative = part.commit(OutputStore(str(tmp_path)), "vectors", "s")
    table = pq.read_table(tmp_path / relative)
    kept = [0, 1, 3, 4, 5, 6, 7]
    assert table.column("id").to_pylist() == [f"d{p}" for p in kept]
    assert table.column("content_hash").to_pylist() == [f"h{p}" for p in kept]
    assert table.column("lang").to_pylist() == [f"l{p}" for p in kept]
    assert table.column("truncated").to_pylist() == [p in (4, 6) for p in kept]
    np.testing.assert_array_equal(np.array(table.column("embedding").to_pylist()), np.stack([vector(p) for p in kept]))
