"""The records the corpus hands to the rest of teibatch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DEFAULT_SHARD_DOCS = 10_000
DEFAULT_TEXT_FIELD = "text"

FORMATS = ("auto", "jsonl", "json", "parquet", "csv", "text")


@dataclass(frozen=True)
class CorpusOptions:
    """How to find and read a corpus; built from the job file's ``corpus`` section."""

    path: str
    format: str = "auto"
    id_field: str | None = None
    text_field: str = DEFAULT_TEXT_FIELD
    keep_fields: tuple[str, ...] = ()
    shard_docs: int = DEFAULT_SHARD_DOCS
    storage_options: dict[str, Any] = field(default_factory=dict, hash=False, compare=False)


@dataclass(frozen=True)
class Shard:
    """A deterministic slice of the corpus: rows ``start``..``stop`` over ``sources`` read in order.

    For row formats ``sources`` is one file; for ``text`` (one document per file) it is the files.
    ``id`` changes whenever the sources' fingerprints, the range or the reading options change.
    """

    id: str
    sources: tuple[str, ...]
    start: int
    stop: int
    format: str

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(frozen=True)
class Document:
    """One document to embed; ``fields`` holds the ``keep_fields`` values."""

    id: str
    text: str
    fields: dict[str, Any] = field(default_factory=dict, hash=False)


@dataclass(frozen=True)
class Reject:
    """A document that cannot be embedded, and why (``reason`` is a short code, ``detail`` prose)."""

    id: str
    reason: str
    detail: str


# Reason codes shared by the corpus and the pipeline.
REJECT_MALFORMED = "malformed_record"
REJECT_MISSING_TEXT = "missing_text"
REJECT_NON_STRING_TEXT = "non_string_text"
REJECT_EMPTY_TEXT = "empty_text"
REJECT_DUPLICATE_ID = "duplicate_id"
