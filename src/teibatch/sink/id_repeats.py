"""Ids that occur more than once among more of them than fit in memory: hash partitions spilled to Parquet.

Every id goes to one of ``count`` partitions by a stable hash of its bytes (CRC-32: the same in every
process and every run, unlike Python's ``hash``), so all occurrences of an id land in one partition.
Writers :func:`spill` their rows into the partitions' folders as Parquet files; then each partition
is read back on its own and grouped (:func:`repeated_in_partition`). A
partition holds about :data:`PARTITION_ROWS` ids whatever the total, so memory stays bounded: 10⁸
ids are 25 partitions, each read and grouped alone, in parallel or one after another.

Two users: the run's id index over the corpus (``pipeline/unique_ids.py``), spilling under the
output, and :func:`check_output_ids` (``teibatch validate``), the check that an output's committed
vectors parts hold each id once, reading only their ``id`` column and spilling to a local temporary
folder.
"""

from __future__ import annotations

import tempfile
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from fsspec.implementations.local import LocalFileSystem

from teibatch.errors import RepeatedIds
from teibatch.sink.manifest import Manifest
from teibatch.sink.parts import VECTORS_DIR, part_name, part_path
from teibatch.sink.store import OutputStore

PARTITION_ROWS = 4_000_000
"""Ids one partition holds at most (on average): a few hundred MB of Arrow memory when grouped."""
ID_COLUMN = "id"
KEY_COLUMN = "key"


def partition_count(total: int) -> int:
    """How many partitions ``total`` ids need (at least one)."""
    return max(1, -(-total // PARTITION_ROWS))


def partition_of(ids: Sequence[str], count: int) -> np.ndarray:
    """Each id's partition: CRC-32 of its UTF-8 bytes, modulo ``count``."""
    return (id_keys(ids) % count).astype(np.int32)


def id_keys(ids: Sequence[str]) -> np.ndarray:
    """Each id's key (CRC-32 of its UTF-8 bytes, as int64): equal ids have equal keys; a few unequal ones do too."""
    return np.fromiter((zlib.crc32(i.encode("utf-8", "surrogatepass")) for i in ids), dtype=np.int64, count=len(ids))


def spill(fs: Any, folder: str, name: str, table: pa.Table, count: int) -> list[int]:
    """Write the rows of ``table`` (an ``id`` column, strings or 64-bit digests, and where each id was)
    to their partitions, as ``<folder>/p<k>/<name>.parquet``, with each id's key (a string id's
    CRC-32; a digest is its own) in a ``key`` column; return the partitions written. ``name`` is the
    writer's own: two writers never write one file."""
    column = table.column(ID_COLUMN)
    if pa.types.is_integer(column.type):
        keys = column.to_numpy()
    else:
        keys = id_keys(column.to_pylist())
        table = table.append_column(KEY_COLUMN, pa.array(keys))
    parts = (keys.view(np.uint64) % count).astype(np.int32)
    written = []
    for k in np.unique(parts).tolist():
        rows = table.filter(pa.array(parts == k)) if count > 1 else table
        fs.makedirs(f"{folder}/p{k}", exist_ok=True)
        with fs.open(f"{folder}/p{k}/{name}.parquet", "wb") as handle:
            pq.write_table(rows, handle)
        written.append(int(k))
    return written


def repeated_in_partition(fs: Any, folder: str, k: int, order: Sequence[str]) -> pa.Table | None:
    """The rows spilled to partition ``k`` whose id occurs more than once there, sorted by id, then by
    ``order``'s columns (``None`` when nothing was spilled there).

    Two passes over the partition's files keep its memory small: the keys alone (8 bytes a row) find
    the keys seen twice, then only rows holding one of them are read whole and grouped by id.
    """
    try:
        files = sorted(str(f) for f in fs.ls(f"{folder}/p{k}", detail=False))
    except FileNotFoundError:
        return None
    if not files:
        return None
    key = ID_COLUMN if pa.types.is_integer(_schema(fs, files[0]).field(ID_COLUMN).type) else KEY_COLUMN
    keys = np.sort(np.concatenate([_read(fs, path, [key]).column(key).to_numpy() for path in files]))
    twice = pa.array(np.unique(keys[1:][keys[1:] == keys[:-1]]))
    tables = [table.filter(pc.is_in(table[key], value_set=twice)) for table in (_read(fs, path) for path in files)]
    rows = pa.concat_tables(tables)
    counts = rows.group_by(ID_COLUMN).aggregate([(ID_COLUMN, "count")])
    many = counts.filter(pc.greater(counts[f"{ID_COLUMN}_count"], 1)).column(ID_COLUMN)
    rows = rows.filter(pc.is_in(rows[ID_COLUMN], value_set=many.combine_chunks()))
    return rows.sort_by([(ID_COLUMN, "ascending"), *((column, "ascending") for column in order)])


def _schema(fs: Any, path: str) -> pa.Schema:
    with fs.open(path, "rb") as handle:
        return pq.read_schema(handle)


def _read(fs: Any, path: str, columns: list[str] | None = None) -> pa.Table:
    with fs.open(path, "rb") as handle:
        return pq.read_table(handle, columns=columns)


@dataclass(frozen=True)
class RepeatedId:
    """An id that two vectors parts (or one part twice) hold: the first two places, as ``part#row``."""

    id: str
    first: str
    again: str


def repeated_output_ids(store: OutputStore, parts: Sequence[str], *, limit: int = 5) -> tuple[int, list[RepeatedId]]:
    """How many ids occur more than once in the ``id`` column of ``parts`` (paths under ``store``), and
    up to ``limit`` of them with their first two places. Reads only the ``id`` column, one part
    at a time, spilling to a local temporary folder."""
    total = 0
    for part in parts:
        with store.fs.open(store.path(part), "rb") as handle:
            total += pq.ParquetFile(handle).metadata.num_rows
    count = partition_count(total)
    found: list[RepeatedId] = []
    repeats = 0
    with tempfile.TemporaryDirectory(prefix="teibatch-ids-") as folder:
        local = LocalFileSystem()
        for index, part in enumerate(parts):
            with store.fs.open(store.path(part), "rb") as handle:
                ids = pq.read_table(handle, columns=[ID_COLUMN]).column(ID_COLUMN)
            spill(local, folder, f"{index:08d}", pa.table({
                ID_COLUMN: ids, "part": pa.array(np.full(len(ids), index, dtype=np.int32)),
                "row": pa.array(np.arange(len(ids), dtype=np.int64))}), count)
        for k in range(count):
            table = repeated_in_partition(local, folder, k, ["part", "row"])
            if table is None:
                continue
            rows = table.to_pylist()
            for at, row in enumerate(rows):
                if at > 0 and rows[at - 1][ID_COLUMN] == row[ID_COLUMN]:
                    continue  # not the id's first place
                repeats += 1
                if len(found) == limit:
                    continue
                again = rows[at + 1]
                found.append(RepeatedId(row[ID_COLUMN], f"{parts[row['part']]}#{row['row']}",
                                        f"{parts[again['part']]}#{again['row']}"))
    return repeats, found


def check_output_ids(store: OutputStore) -> int:
    """Raise :class:`RepeatedIds` when the committed vectors parts of the output at ``store`` hold an id
    more than once; return how many parts were checked (none when there is no manifest)."""
    manifest = Manifest.load(store)
    if manifest is None:
        return 0
    present = set(store.list(VECTORS_DIR))
    # In plan order, so that an id's first place is the one a run keeps.
    order = [sid for sid in manifest.planned if sid in manifest.shards]
    order += sorted(set(manifest.shards) - set(order))
    parts = [part_path(VECTORS_DIR, sid) for sid in order if part_name(sid) in present]
    repeats, found = repeated_output_ids(store, parts)
    if repeats:
        shown = "; ".join(f"{r.id!r} in {r.first} and {r.again}" for r in found)
        raise RepeatedIds(f"{store.url}: {repeats} id(s) appear more than once in the vectors parts: {shown}; "
                          "remove the extra rows, or run the job again into a new output.path")
    return len(parts)
