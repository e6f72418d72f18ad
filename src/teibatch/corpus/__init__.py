"""Read a corpus from any fsspec location, cut it into deterministic shards, hash document content."""

from __future__ import annotations

from teibatch.corpus.hashing import content_hash
from teibatch.corpus.kept import KeptFields, keep_field_types
from teibatch.corpus.listing import SourceFile, list_sources
from teibatch.corpus.probe import CorpusProbe, probe_corpus
from teibatch.corpus.records import (
    REJECT_DUPLICATE_ID,
    REJECT_EMPTY_TEXT,
    REJECT_MALFORMED,
    REJECT_MISSING_TEXT,
    REJECT_NON_STRING_TEXT,
    BadFile,
    CorpusOptions,
    Document,
    Reject,
    Shard,
)
from teibatch.corpus.sharding import plan_shards, read_shard

__all__ = [
    "REJECT_DUPLICATE_ID",
    "REJECT_EMPTY_TEXT",
    "REJECT_MALFORMED",
    "REJECT_MISSING_TEXT",
    "REJECT_NON_STRING_TEXT",
    "BadFile",
    "CorpusOptions",
    "CorpusProbe",
    "Document",
    "KeptFields",
    "Reject",
    "Shard",
    "SourceFile",
    "content_hash",
    "keep_field_types",
    "list_sources",
    "plan_shards",
    "probe_corpus",
    "read_shard",
]
