"""Turn raw rows into ``Document``s or ``Reject``s, and say which types the kept fields have.

A bad row never stops a shard: it becomes a ``Reject`` with a reason code from ``records.py`` and a
detail a person can act on.

The id rule (``docs/output.md``): with ``id_field`` set, a non-empty string is the id as it is, an
integer (not a bool) becomes its decimal string, and anything else — no such field in the record,
an empty string, null, a bool, a float, a list or an object — rejects the row as
``malformed_record``. Only when the job sets no ``id_field`` (and for text files, which have no
fields) does a row take its place as id: ``"<relative path>#<row number>"``.

Kept fields are strings for JSON, CSV, text and builtin sources (non-strings JSON-encoded, missing
or null as ``None``) and native values for Parquet, so that ``keep_field_types`` can give the
output one schema across all its parts.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa

from teibatch.corpus.builtin import BUILTIN_ID_FIELD
from teibatch.corpus.formats import FORMAT_BUILTIN, detect_format
from teibatch.corpus.listing import list_sources, resolve_root
from teibatch.corpus.readers import Malformed, Row, parquet_schema
from teibatch.corpus.records import (
    REJECT_EMPTY_TEXT,
    REJECT_MALFORMED,
    REJECT_MISSING_TEXT,
    REJECT_NON_STRING_TEXT,
    CorpusOptions,
    Document,
    Reject,
)
from teibatch.errors import CorpusError, CorpusMismatch


def fallback_id(relative_path: str, row_number: int) -> str:
    """The stable id of a row without one: its file relative to the corpus root and its row number."""
    return f"{relative_path}#{row_number}"


@dataclass(frozen=True)
class DocumentRules:
    """How rows of one format become documents (built by ``for_format`` from the job's options)."""

    id_field: str | None
    text_field: str
    keep_fields: tuple[str, ...]
    native: bool = False
    """Keep field values as the source typed them (Parquet) instead of as strings."""

    @classmethod
    def for_format(cls, options: CorpusOptions, fmt: str) -> DocumentRules:
        """The rules for ``fmt``: text files take their id from the path; builtins default to ``id``."""
        id_field = options.id_field
        if fmt == "text":
            id_field = None
        elif fmt == FORMAT_BUILTIN and id_field is None:
            id_field = BUILTIN_ID_FIELD
        return cls(id_field, options.text_field, tuple(options.keep_fields), native=fmt == "parquet")

    def columns(self) -> list[str]:
        """The fields a columnar reader needs, in a fixed order."""
        wanted = [self.id_field] if self.id_field else []
        return list(dict.fromkeys([*wanted, self.text_field, *self.keep_fields]))

    def to_item(self, row: Row, fallback: str) -> Document | Reject:
        """A ``Document``, or a ``Reject`` saying why the row cannot be embedded."""
        if isinstance(row, Malformed):
            return Reject(fallback, REJECT_MALFORMED, row.detail)
        doc_id = self.id_of(row, fallback)
        if isinstance(doc_id, Reject):
            return doc_id
        if self.text_field not in row:
            return Reject(doc_id, REJECT_MISSING_TEXT, f"{fallback}: no field {self.text_field!r}")
        text = row[self.text_field]
        if not isinstance(text, str):
            kind = "null" if text is None else type(text).__name__
            return Reject(doc_id, REJECT_NON_STRING_TEXT,
                          f"{fallback}: field {self.text_field!r} holds {kind}, not a string")
        if not text.strip():
            return Reject(doc_id, REJECT_EMPTY_TEXT, f"{fallback}: field {self.text_field!r} is empty")
        return Document(doc_id, text, {name: self._kept(row.get(name)) for name in self.keep_fields})

    def id_of(self, row: dict[str, Any], fallback: str) -> str | Reject:
        """The row's id under the id rule (module doc), or a ``malformed_record`` ``Reject``."""
        if not self.id_field:
            return fallback
        if self.id_field not in row:
            return Reject(fallback, REJECT_MALFORMED, f"{fallback}: no id field {self.id_field!r} in this record")
        value = row[self.id_field]
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        kind = "an empty string" if value == "" else "null" if value is None else type(value).__name__
        return Reject(fallback, REJECT_MALFORMED,
                      f"{fallback}: id field {self.id_field!r} holds {kind}; "
                      "ids must be non-empty strings or integers")

    def _kept(self, value: Any) -> Any:
        if self.native or value is None or isinstance(value, str):
            return value
        try:
            return orjson.dumps(value).decode()
        except TypeError:
            return str(value)


def keep_field_types(options: CorpusOptions, files: Iterable[str] | None = None) -> dict[str, pa.DataType]:
    """The Arrow type of each kept field, the same for every output part.

    ``files`` are source paths relative to the corpus root (``Shard.sources``); ``None`` lists the
    corpus. JSON, CSV, text and builtin fields are strings; a Parquet field has its column's type
    (string when no file has the column). Parquet files that disagree on a type raise ``CorpusError``;
    a file that is not readable Parquet is left out (reading its shard reports it).
    """
    if not options.keep_fields:
        return {}
    if files is None:
        root, listed = list_sources(options)
        paths = [source.path for source in listed]
    else:
        root, paths = resolve_root(options), list(dict.fromkeys(files))
    found: dict[str, tuple[pa.DataType, str]] = {}
    for path in paths:
        fmt = detect_format(path, options.format)
        try:
            schema = parquet_schema(root.fs, root.url(path), path) if fmt.name == "parquet" else None
        except CorpusMismatch:
            continue  # not Parquet at all: its own shard reports it (see readers.py)
        for name in options.keep_fields:
            if schema is not None and schema.get_field_index(name) < 0:
                continue
            kind = schema.field(name).type if schema is not None else pa.string()
            seen = found.setdefault(name, (kind, path))
            if seen[0] != kind:
                raise CorpusError(f"keep field {name!r} is {seen[0]} in {seen[1]} but {kind} in {path}; "
                                  "the output needs one type per field")
    return {name: found.get(name, (pa.string(), ""))[0] for name in options.keep_fields}
