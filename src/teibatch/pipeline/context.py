"""What a shard task needs to know, as one picklable record sent from the driver to Ray workers."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teibatch.corpus.kept import KeptFields
from teibatch.corpus.records import CorpusOptions
from teibatch.pipeline.chunks import ChunkPlan
from teibatch.pipeline.dedup import Dedup
from teibatch.pipeline.moved_texts import MovedTexts
from teibatch.pipeline.unique_ids import IdIndex
from teibatch.sink.parts import VectorSchema, WriteOptions


@dataclass(frozen=True)
class ShardContext:
    """Everything a shard task needs besides the shard itself and the senders it embeds through."""

    corpus: CorpusOptions
    hash_options: dict[str, Any]
    schema: VectorSchema
    write: WriteOptions
    output: str
    output_options: dict[str, Any] = field(default_factory=dict)
    kept: KeptFields | None = None
    """The output's kept-field types (``schema.kept``) and which fields are written as text."""
    chunking: ChunkPlan | None = None
    """How documents are cut into chunks; ``None``: each document is embedded whole."""
    dedup: Dedup | None = None
    """With ``corpus.deduplicate``, the run's registry: identical texts are sent once, within the shard
    and across the run's shards (``pipeline/dedup.py``)."""
    moved: MovedTexts | None = None
    """Incremental mode: the earlier output's texts by content hash (``pipeline/moved_texts.py``)."""
    landed: Any = None
    """The actor that keeps the run's :class:`~teibatch.pipeline.landed.LandedDocuments` (its first
    sender): what landed inside shards still running, for the progress display; ``None``: nothing
    is told before a shard ends."""
    ids: IdIndex | None = None
    """Documents whose id an earlier shard of the plan holds: rejected as duplicates (``pipeline/unique_ids.py``)."""
