"""Incremental mode: a text that moved to another file (or another id) keeps the vector it had.

The (id, content hash) lookup of ``pipeline/shard.py`` finds a document only in the parts that were
written for its own files. This index finds a text by its content hash in every vectors part the
output's manifest lists (the committed shards, those of files that changed included): the driver
reads their ``content_hash`` column once per run and keeps the first 8 bytes of each hash, sorted,
with the number of its part — 12 bytes a row, and at most :data:`MAX_INDEXED_ROWS` rows (the parts
beyond are left out, and their texts are sent again). A shard looks its texts up there, then reads
the vectors from the parts the index points to, and keeps only rows whose whole hash matches: two
hashes that share their first 8 bytes cost a part read, never a wrong vector.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow.parquet as pq

from teibatch.sink import Manifest, OutputStore, VectorSchema, read_vectors
from teibatch.sparse import Vector

log = logging.getLogger(__name__)

MAX_INDEXED_ROWS = 50_000_000  # 600 MB in the driver and, shared, in each node's object store
PREFIX_HEX = 16


def prefix(content_hash: str) -> int:
    """The index's key of a content hash: its first 8 bytes, as an unsigned integer."""
    return int(content_hash[:PREFIX_HEX], 16)


@dataclass(frozen=True)
class MovedTexts:
    """The earlier output's texts by content hash: ``prefixes`` sorted, ``part_of`` each one's part in ``parts``."""

    parts: tuple[str, ...]
    prefixes: np.ndarray  # uint64
    part_of: np.ndarray  # uint32

    def find(self, store: OutputStore, hashes: Iterable[str],
             schema: VectorSchema) -> dict[str, tuple[str, Vector, bool]]:
        """``content_hash → (content_hash, vector, truncated)`` for those of ``hashes`` the earlier output holds
        (``schema``: the output's, as :func:`~teibatch.sink.parts.read_vectors` takes it)."""
        wanted = set(hashes)
        if not wanted or not len(self.prefixes):
            return {}
        keys = np.fromiter((prefix(h) for h in wanted), dtype=np.uint64, count=len(wanted))
        low = np.searchsorted(self.prefixes, keys, side="left")
        high = np.searchsorted(self.prefixes, keys, side="right")
        parts = sorted({int(p) for lo, hi in zip(low, high, strict=True) if hi > lo for p in self.part_of[lo:hi]})
        return read_vectors(store, [self.parts[p] for p in parts], wanted, schema, by="content_hash")


def index_moved_texts(store: OutputStore, manifest: Manifest) -> MovedTexts | None:
    """The index over every vectors part ``manifest`` lists; ``None`` when it lists none."""
    parts: list[str] = []
    prefixes: list[np.ndarray] = []
    rows = 0
    for shard_id, entry in sorted(manifest.shards.items()):
        relative = entry.vectors_part(shard_id)
        try:
            with store.fs.open(store.path(relative), "rb") as handle:
                column = pq.read_table(handle, columns=["content_hash"]).column("content_hash").to_pylist()
        except FileNotFoundError:
            continue
        if rows + len(column) > MAX_INDEXED_ROWS:
            log.warning("moved texts: the output holds more than %d rows; the vectors of texts in its other parts "
                        "are not looked up by content hash", MAX_INDEXED_ROWS)
            break
        parts.append(relative)
        prefixes.append(np.fromiter((prefix(h) for h in column), dtype=np.uint64, count=len(column)))
        rows += len(column)
    if not parts:
        return None
    keys = np.concatenate(prefixes)
    owners = np.concatenate([np.full(len(p), i, dtype=np.uint32) for i, p in enumerate(prefixes)])
    order = np.argsort(keys, kind="stable")
    return MovedTexts(tuple(parts), keys[order], owners[order])
