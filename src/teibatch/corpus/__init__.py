"""Read a corpus from any fsspec location, cut it into deterministic shards, hash document content,
and cut long documents into chunks counted by the servers' own token rule."""

from __future__ import annotations

from teibatch.corpus.chunking import REJECT_UNCHUNKABLE, Chunk, ChunkedDocument, Chunker, ChunkingOptions
from teibatch.corpus.hashing import content_hash, content_hasher
from teibatch.corpus.kept import KeptFields, keep_field_types
from teibatch.corpus.listing import LeftOut, Listing, SourceFile, list_corpus, list_sources
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
from teibatch.corpus.token_count import ApproxTokenCounter, CharCounter, HFTokenCounter, TokenCounter
from teibatch.corpus.tokenizer_files import find_tokenizer_file, load_token_counter

__all__ = [
    "REJECT_DUPLICATE_ID",
    "REJECT_EMPTY_TEXT",
    "REJECT_MALFORMED",
    "REJECT_MISSING_TEXT",
    "REJECT_NON_STRING_TEXT",
    "REJECT_UNCHUNKABLE",
    "ApproxTokenCounter",
    "BadFile",
    "CharCounter",
    "Chunk",
    "ChunkedDocument",
    "Chunker",
    "ChunkingOptions",
    "CorpusOptions",
    "CorpusProbe",
    "Document",
    "HFTokenCounter",
    "KeptFields",
    "LeftOut",
    "Listing",
    "Reject",
    "Shard",
    "SourceFile",
    "TokenCounter",
    "content_hash",
    "content_hasher",
    "find_tokenizer_file",
    "keep_field_types",
    "list_corpus",
    "list_sources",
    "load_token_counter",
    "plan_shards",
    "probe_corpus",
    "read_shard",
]
