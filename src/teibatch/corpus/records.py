"""The records the corpus hands to the rest of teibatch."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teibatch.errors import CorpusMismatch

DEFAULT_SHARD_DOCS = 10_000
DEFAULT_TEXT_FIELD = "text"

FORMATS = ("auto", "jsonl", "json", "parquet", "csv", "text")

# What a file that cannot be read to its end does: fail its shard (``CorpusMismatch``, the default),
# or reject what cannot be read as ``malformed_record`` and keep the rows before it.
ON_BAD_FILE_FAIL = "fail"
ON_BAD_FILE_REJECT = "reject"

# How an output types its kept fields (``kept.py``): values keep their types, each field one type
# for the whole output (the default); or values of JSON, CSV and builtin sources become text.
KEEP_FIELDS_STRICT = "strict"
KEEP_FIELDS_STRINGIFY = "stringify"


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
    on_bad_file: str = ON_BAD_FILE_FAIL
    exclude: tuple[str, ...] = ()
    """Folders under the corpus root (relative to it, POSIX) whose files are never corpus: the job's
    own output when it lies inside the corpus (``corpus/overlap.py``). Not part of any shard id."""
    exclude_globs: tuple[str, ...] = ()
    """The job's ``corpus.exclude``: glob patterns (``fnmatch``, ``*`` crossing ``/``) of paths relative to
    the corpus root; a file is left out when one matches its path or one of its folders'. Not part of
    any shard id (it decides which files are listed, not what a file's shards hold)."""
    keep_fields_types: str = KEEP_FIELDS_STRICT
    title_field: str | None = None
    """A field read as each document's ``title`` (chunking prepends it to every chunk); not kept unless
    ``keep_fields`` names it too."""


@dataclass(frozen=True)
class BadFile:
    """A source file that planning found unreadable: corrupt or truncated compression, a CSV quote
    that never closes, a JSON document whose brackets do not balance. ``message`` is the whole text
    of the error (it starts with the file and line); ``line`` is where, when known."""

    file: str
    message: str
    line: int | None = None

    @classmethod
    def from_error(cls, file: str, error: CorpusMismatch) -> BadFile:
        """The record of ``error``, raised while reading ``file``."""
        return cls(file, str(error), error.line)

    def error(self) -> CorpusMismatch:
        """The error that reading this file's shard raises: the same text, file and line."""
        error = CorpusMismatch(self.message)  # the message already starts with "file:line: "
        error.file, error.line = self.file, self.line
        return error


@dataclass(frozen=True)
class RowMark:
    """Where row ``row`` of an uncompressed JSON-lines file begins: at byte ``offset``, after ``line`` lines.

    Planning notes one at each shard's first row while it counts the file, so that reading a shard
    starts there instead of splitting every line before it: without it, reading all of a file's
    shards split the file's lines about (shards + 1) / 2 times over.
    """

    row: int
    offset: int
    line: int


@dataclass(frozen=True)
class Shard:
    """A deterministic slice of the corpus: rows ``start``..``stop`` over ``sources`` read in order.

    For row formats ``sources`` is one file; for ``text`` (one document per file) it is the files.
    ``id`` changes whenever the sources' fingerprints, the range or the reading options change.
    ``bad_file`` is set on the one shard planned for a file that cannot be read (with
    ``on_bad_file: fail``): reading that shard raises its ``CorpusMismatch``. ``mark``: where its
    first row begins, for an uncompressed JSON-lines file (:class:`RowMark`).
    """

    id: str
    sources: tuple[str, ...]
    start: int
    stop: int
    format: str
    bad_file: BadFile | None = None
    mark: RowMark | None = field(default=None, compare=False)  # not part of what the shard is

    @property
    def size(self) -> int:
        return self.stop - self.start


@dataclass(slots=True)
class Document:
    """One document to embed; ``fields`` holds the ``keep_fields`` values, ``title`` the ``title_field``
    value as text (empty when the job names none or the record has none)."""

    id: str
    text: str
    fields: dict[str, Any] = field(default_factory=dict, hash=False)
    title: str = ""


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
