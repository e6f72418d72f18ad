"""Committed parts checked against the files: a vectors part removed or cut since its shard was committed.

The manifest records each committed shard's vectors part with its size (``ShardEntry.bytes``; a
manifest written before sizes were recorded: only its presence is checked). A rerun re-embeds a
shard whose part is gone or not the size recorded, and ``teibatch status`` names those parts.
One listing of ``vectors/`` answers for every shard.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from teibatch.sink.manifest import Manifest
from teibatch.sink.parts import VECTORS_DIR
from teibatch.sink.store import OutputStore


@dataclass(frozen=True)
class PartCheck:
    """Of the committed shards checked: those whose vectors part is ``missing``, those whose part is not
    the size recorded (``wrong_size``), and the rows of the others (``rows``)."""

    missing: tuple[str, ...]
    wrong_size: tuple[str, ...]
    rows: int

    @property
    def bad(self) -> tuple[str, ...]:
        """Shards whose part cannot be trusted: their rows are not (all) in ``vectors/``."""
        return self.missing + self.wrong_size


def check_parts(store: OutputStore, manifest: Manifest, shard_ids: Iterable[str]) -> PartCheck:
    """Check the vectors part of each committed shard of ``shard_ids`` (uncommitted ones are skipped)."""
    sizes = store.sizes(VECTORS_DIR)
    missing, wrong, rows = [], [], 0
    for shard_id in shard_ids:
        entry = manifest.shards.get(shard_id)
        if entry is None:
            continue
        size = sizes.get(entry.vectors_part(shard_id).rpartition("/")[2])
        if size is None:
            missing.append(shard_id)
        elif entry.bytes is not None and size != entry.bytes:
            wrong.append(shard_id)
        else:
            rows += entry.rows
    return PartCheck(tuple(missing), tuple(wrong), rows)
