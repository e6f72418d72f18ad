"""Turn raw rows into ``Document``s or ``Reject``s.

A bad row never stops a shard: it becomes a ``Reject`` with a reason code from ``records.py`` and a
detail that starts with the row's place (``rows.Place``). Fields are found by path (``paths.py``:
``doc.body`` is ``body`` inside ``doc``, unless the record has a key ``"doc.body"``).

The id rule (``docs/output.md``): with ``id_field`` set, a non-empty string is the id as it is, an
integer (not a bool) becomes its decimal string, and anything else — no such field in the record,
an empty string, null, a bool, a float, a list or an object — rejects the row as
``malformed_record``. Only when the job sets no ``id_field`` (and for text files, which have no
fields) does a row take its place as id: ``"<relative path>#<row number>"``. Since an integer id is
written as its decimal string, ``1`` and ``"1"`` are one id: a shard rejects the second as a
duplicate, saying so (``repeated_id``). A malformed row keeps its own id when a lenient reading
could still find it (``Malformed.record``).

Kept fields follow the output's ``KeptFields`` (``kept.py``): a stringified field's value is JSON
text, any other value must fit its field's type unchanged, or reading stops with a
``CorpusMismatch`` naming the file, line, field and both types. Missing or null values are
``None``. Without a ``KeptFields`` (a reader that writes nothing, such as ``teibatch plan``'s sample), values
are as ``stringify`` has them: strings for JSON, CSV, text and builtin sources, native for Parquet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from teibatch.corpus.builtin import BUILTIN_ID_FIELD
from teibatch.corpus.formats import FORMAT_BUILTIN
from teibatch.corpus.kept import KeptFields, stringify, type_name, unfit
from teibatch.corpus.paths import MISSING, lookup
from teibatch.corpus.records import (
    REJECT_EMPTY_TEXT,
    REJECT_MALFORMED,
    REJECT_MISSING_TEXT,
    REJECT_NON_STRING_TEXT,
    CorpusOptions,
    Document,
    Reject,
)
from teibatch.corpus.rows import Malformed, Place, Row
from teibatch.errors import CorpusMismatch


@dataclass(frozen=True)
class DocumentRules:
    """How rows of one format become documents (built by ``for_format`` from the job's options)."""

    id_field: str | None
    text_field: str
    keep_fields: tuple[str, ...]
    native: bool = False
    """The source types its values (Parquet): they fit the output's types by planning's check."""
    kept: KeptFields | None = None
    """The output's kept-field types; ``None``: values as ``stringify`` has them (module doc)."""
    title_field: str | None = None

    @classmethod
    def for_format(cls, options: CorpusOptions, fmt: str, kept: KeptFields | None = None) -> DocumentRules:
        """The rules for ``fmt``: text files take their id from the path; builtins default to ``id``."""
        id_field = options.id_field
        if fmt == "text":
            id_field = None
        elif fmt == FORMAT_BUILTIN and id_field is None:
            id_field = BUILTIN_ID_FIELD
        return cls(id_field, options.text_field, tuple(options.keep_fields), native=fmt == "parquet", kept=kept,
                   title_field=None if fmt == "text" else options.title_field)

    def columns(self) -> list[str]:
        """The fields a columnar reader needs, in a fixed order."""
        wanted = [self.id_field] if self.id_field else []
        titled = [self.title_field] if self.title_field else []
        return list(dict.fromkeys([*wanted, self.text_field, *self.keep_fields, *titled]))

    def to_item(self, row: Row, place: Place) -> Document | Reject:
        """A ``Document``, or a ``Reject`` saying why the row cannot be embedded.

        Raises ``CorpusMismatch`` when a kept value does not fit the output's type for its field.
        """
        if isinstance(row, Malformed):
            own = self.id_of(row.record, place) if row.record is not None and self.id_field else None
            return Reject(own if isinstance(own, str) and _writable(own) else place.id, REJECT_MALFORMED, row.detail)
        doc_id = self.id_of(row, place)
        if isinstance(doc_id, Reject):
            return doc_id
        text = lookup(row, self.text_field)
        if text is MISSING:
            return Reject(doc_id, REJECT_MISSING_TEXT, f"{place}: no field {self.text_field!r}")
        if not isinstance(text, str):
            kind = "null" if text is None else type(text).__name__
            return Reject(doc_id, REJECT_NON_STRING_TEXT,
                          f"{place}: field {self.text_field!r} holds {kind}, not a string")
        if not text or text.isspace():  # what strip() would empty, without making the stripped copy
            return Reject(doc_id, REJECT_EMPTY_TEXT, f"{place}: field {self.text_field!r} is empty")
        if not self.keep_fields and not self.title_field:  # most jobs: no per-row dict or call for nothing
            return Document(doc_id, text)
        return Document(doc_id, text, {name: self._kept(name, lookup(row, name), place) for name in self.keep_fields},
                        self._title(row))

    @property
    def quick(self) -> bool:
        """Whether :meth:`plain` can decide rows: an id field, and no kept field or title to read."""
        return self.id_field is not None and not self.keep_fields and not self.title_field

    def plain(self, row: Row) -> tuple[str, str, bool] | None:
        """The common row at a fraction of :meth:`to_item`'s cost (rules with :attr:`quick` only): a
        record whose id field, under its literal key, holds a non-empty string or an integer, and whose
        text field, under its literal key, holds text that is not blank. Gives ``(id, text, integer id?)``;
        ``None`` for any other row, which :meth:`to_item` then decides (rejects, nested paths)."""
        if type(row) is not dict:
            return None
        text = row.get(self.text_field)
        if type(text) is not str or not text or text.isspace():
            return None
        doc_id = row.get(self.id_field)  # type: ignore[arg-type]
        if type(doc_id) is str and doc_id:
            return doc_id, text, False
        if type(doc_id) is int:  # not a bool: its type is bool
            return str(doc_id), text, True
        return None

    def id_of(self, row: dict[str, Any], place: Place) -> str | Reject:
        """The row's id under the id rule (module doc), or a ``malformed_record`` ``Reject``."""
        if not self.id_field:
            return place.id
        value = lookup(row, self.id_field)
        if value is MISSING:
            return Reject(place.id, REJECT_MALFORMED, f"{place}: no id field {self.id_field!r} in this record")
        if isinstance(value, str) and value:
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        kind = "an empty string" if value == "" else "null" if value is None else type(value).__name__
        return Reject(place.id, REJECT_MALFORMED,
                      f"{place}: id field {self.id_field!r} holds {kind}; "
                      "ids must be non-empty strings or integers")

    def integer_id(self, row: Row) -> bool:
        """Whether the row's id field holds an integer (its id is then the integer's decimal string)."""
        if not self.id_field or isinstance(row, Malformed):
            return False
        value = lookup(row, self.id_field)
        return isinstance(value, int) and not isinstance(value, bool)

    def _title(self, row: dict[str, Any]) -> str:
        """The title field's value as text: a string as it is, nothing (missing, null) as ``""``,
        anything else as compact JSON."""
        if not self.title_field:
            return ""
        value = lookup(row, self.title_field)
        if value is MISSING:
            return ""
        return stringify(value) or ""

    def _kept(self, name: str, value: Any, place: Place) -> Any:
        if value is MISSING:
            return None
        if self.kept is None:
            return value if self.native else stringify(value)
        if name in self.kept.stringified:
            return stringify(value)
        kind = self.kept.types[name]
        if self.native or (what := unfit(value, kind)) is None:
            return value
        where = f"row {place.row}: " if place.line is None else ""
        raise CorpusMismatch(
            f"{where}kept field {name!r} holds {what}, but the output's column {name!r} is {type_name(kind)}; "
            f"fix the record and run the same command again, or set corpus.keep_fields_types: stringify to write "
            f"{name!r} as JSON text (in a new output.path if this one already holds vectors)",
            file=place.path, line=place.line, field=name)


@dataclass(frozen=True)
class IdSeen:
    """Where a shard first saw an id, and whether the record held it as an integer."""

    place: Place
    integer: bool


def repeated_id(doc_id: str, first: IdSeen, again: IdSeen) -> str:
    """Why a record whose id was seen before is a duplicate: both records' places (the first one's
    file too when it is another file) and, when only the rule that writes integers as decimal
    strings made the ids equal, both types."""
    where = first.place.short if first.place.path == again.place.path else str(first.place)
    if first.integer != again.integer:
        def typed(seen: IdSeen) -> str:
            return f"integer {doc_id}" if seen.integer else f'string "{doc_id}"'

        kind = "integer" if again.integer else "string"
        return (f'id "{doc_id}" ({kind}, {again.place.short}) collides with {typed(first)} ({where}): '
                "integer ids are written as decimal strings")
    return f"id {doc_id!r} ({again.place.short}) was already seen ({where})"


def _writable(doc_id: str) -> bool:
    """Whether a salvaged id can be written (one that holds a lone surrogate cannot)."""
    try:
        doc_id.encode()
    except UnicodeEncodeError:
        return False
    return True
