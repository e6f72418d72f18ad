"""Repeated ids found in bounded memory: hash partitions spilled to Parquet, and the output's id check."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from fsspec.implementations.local import LocalFileSystem

from teibatch.errors import RepeatedIds
from teibatch.sink import Manifest, OutputStore, check_output_ids, id_repeats
from teibatch.sink.id_repeats import partition_of, repeated_in_partition, spill


def test_an_id_has_the_same_partition_in_every_process() -> None:
    # CRC-32 of the UTF-8 bytes: fixed values, unlike Python's per-process hash of a str.
    assert partition_of(["d95", "c0", "é"], 7).tolist() == [0, 0, 4]
    assert partition_of(["d95"], 1).tolist() == [0]


def repeats_in(fs: LocalFileSystem, folder: Path, count: int) -> list[tuple[object, ...]]:
    found = []
    for k in range(count):
        table = repeated_in_partition(fs, str(folder), k, ["writer", "row"])
        if table is not None:
            found += [(r["id"], r["writer"], r["row"]) for r in table.to_pylist()]
    return sorted(found)


@pytest.mark.parametrize("count", [1, 3])
def test_spilled_partitions_hold_every_occurrence_of_an_id_together(tmp_path: Path, count: int) -> None:
    fs = LocalFileSystem()
    # "plumless" and "buckeroo" share a CRC-32, the key that picks which rows are grouped by id: same
    # key, different ids, so neither is a repeat.
    for writer, ids in enumerate([["a", "b", "c", "d", "plumless"], ["c", "e", "a", "a", "buckeroo"]]):
        spill(fs, str(tmp_path), f"w{writer}", pa.table({"id": ids, "writer": [writer] * 5, "row": range(5)}),
              count)
    assert repeats_in(fs, tmp_path, count) == [("a", 0, 0), ("a", 1, 2), ("a", 1, 3), ("c", 0, 2), ("c", 1, 0)]
    assert repeated_in_partition(fs, str(tmp_path / "none"), 0, []) is None


def test_ids_that_are_64_bit_digests_are_their_own_keys(tmp_path: Path) -> None:
    fs = LocalFileSystem()
    for writer, ids in enumerate([[-1, 2**62, 5], [5, 7, -1]]):
        spill(fs, str(tmp_path), f"w{writer}", pa.table({"id": pa.array(ids, pa.int64()), "writer": [writer] * 3,
                                                          "row": range(3)}), 2)
    assert repeats_in(fs, tmp_path, 2) == [(-1, 0, 0), (-1, 1, 2), (5, 0, 2), (5, 1, 0)]


def output_with_parts(root: Path, parts: dict[str, list[str]]) -> OutputStore:
    """An output whose manifest commits ``parts`` (shard id → ids), planned in that order."""
    store = OutputStore(str(root))
    manifest = Manifest("fingerprint", "job", planned=list(parts))
    for shard_id, ids in parts.items():
        (root / "vectors").mkdir(parents=True, exist_ok=True)
        pq.write_table(pa.table({"id": ids}), root / "vectors" / f"part-{shard_id}.parquet")
        manifest.commit(shard_id, len(ids), 0, "run")
    manifest.save(store)
    return store


@pytest.mark.parametrize("partition_rows", [pytest.param(None, id="one-partition"),
                                            pytest.param(2, id="many-partitions")])
def test_check_output_ids_names_a_repeated_id_and_both_places(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              partition_rows: int | None) -> None:
    if partition_rows is not None:
        monkeypatch.setattr(id_repeats, "PARTITION_ROWS", partition_rows)
    clean = output_with_parts(tmp_path / "clean", {"ffff": ["a0", "a1"], "0000": ["b0", "b1", "b2"]})
    assert check_output_ids(clean) == 2
    store = output_with_parts(tmp_path / "out", {"ffff": ["a0", "a1"], "0000": ["b0", "a1", "b2", "b0"]})
    with pytest.raises(RepeatedIds) as caught:
        check_output_ids(store)
    message = str(caught.value)
    assert "2 id(s) appear more than once" in message
    # In plan order: the part planned first holds a1's first place, whatever the shard ids' order.
    assert "'a1' in vectors/part-ffff.parquet#1 and vectors/part-0000.parquet#1" in message
    assert "'b0' in vectors/part-0000.parquet#0 and vectors/part-0000.parquet#3" in message


def test_an_output_without_a_manifest_has_nothing_to_check(tmp_path: Path) -> None:
    assert check_output_ids(OutputStore(str(tmp_path / "empty"))) == 0
