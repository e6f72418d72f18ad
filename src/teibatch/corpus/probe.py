"""Check that a corpus fits its job before any work, from its first records only.

``probe_corpus`` lists the corpus (nothing matching is a ``CorpusMismatch`` naming the path),
decides every file's format (an unknown extension fails here), reads up to ``PROBE_RECORDS``
records of the first file that has any, and checks them against the job's ``corpus`` section: the
records parse, the text field, the id field and every kept field appear in them — as paths, so
``doc.body`` looks inside ``doc`` (``paths.py``) — else a ``CorpusMismatch`` names the file and the
field and lists the field paths seen, nested keys included; the text field holds text, and the id
field holds usable, mostly distinct ids (an id repeated only because an integer and a string with
the same digits are one id says so). It also says what the sample holds in each kept field, from
which a run decides the output's kept-field types (``kept.py``). It reads nothing past the sample, so
``teibatch validate`` and the start of ``teibatch run`` pay one listing and a few reads whatever
the size of the corpus. What only a whole read can find (a bad file further on) is left to the
shards, which report it with the file's name.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from teibatch.corpus.documents import DocumentRules, IdSeen, repeated_id
from teibatch.corpus.formats import FileFormat, detect_format
from teibatch.corpus.kept import FieldSample, sample_fields, sample_type
from teibatch.corpus.listing import CorpusRoot, LeftOut, SourceFile, list_corpus
from teibatch.corpus.paths import MISSING, lookup, record_paths, schema_paths, schema_type, shown
from teibatch.corpus.readers import Malformed, Row, iter_rows, parquet_schema, read_text
from teibatch.corpus.records import KEEP_FIELDS_STRICT, REJECT_DUPLICATE_ID, CorpusOptions, Document, Reject
from teibatch.corpus.rows import Place
from teibatch.errors import CorpusMismatch

PROBE_RECORDS = 100
"""How many records of the first file the probe reads."""

PROBE_FILES = 10
"""How many files (in order) the probe tries before it calls a corpus empty."""

MAX_REPEATED_ID_SHARE = 0.1
"""Repeated ids in the sample above this share mean the id field is not an id: the probe fails.
Fewer are data (the run rejects them as ``duplicate_id``) and are listed in the result."""


@dataclass(frozen=True)
class CorpusProbe:
    """What the probe found, for ``teibatch validate`` and the run to print.

    ``files`` is how many files the path matched; ``sample_file`` (relative to the corpus root) and
    ``format`` say which file was sampled; ``records`` how many of its records were read; ``fields``
    the fields seen in them (or the Parquet columns), in order; ``rejects`` how many of the sampled
    records a run would reject, by reason; ``repeated_ids`` ids seen more than once in the sample,
    and ``id_collisions`` why, for those repeated only because integer ids are written as decimal
    strings. ``kept`` says what the sample holds in each kept field (nothing for a Parquet sample,
    whose columns carry their types), ``keep_fields_types`` the job's rule for them. ``left_out``: the
    files the listing matched but leaves out (hidden, marker files, the output inside the corpus).
    """

    path: str
    files: int
    sample_file: str
    format: str
    records: int
    fields: tuple[str, ...]
    rejects: dict[str, int] = field(default_factory=dict, hash=False)
    repeated_ids: tuple[str, ...] = ()
    id_collisions: tuple[str, ...] = ()
    kept: dict[str, FieldSample] = field(default_factory=dict, hash=False)
    keep_fields_types: str = KEEP_FIELDS_STRICT
    left_out: LeftOut = field(default_factory=LeftOut)

    def summary(self) -> str:
        """One line for a person: what matched, what was sampled, what a run would reject."""
        files = f"{self.files} file{'s' if self.files != 1 else ''}"
        line = (f"{self.path}: {files}; sampled {self.records} record{'s' if self.records != 1 else ''} "
                f"of {self.sample_file} ({self.format}); fields: {', '.join(self.fields) or 'none'}")
        if self.rejects:
            reasons = ", ".join(f"{reason} {count}" for reason, count in sorted(self.rejects.items()))
            line += f"; would reject {sum(self.rejects.values())} ({reasons})"
        if self.repeated_ids:
            line += f"; repeated ids: {', '.join(repr(i) for i in self.repeated_ids[:5])}"
        if self.id_collisions:
            line += f" ({'; '.join(self.id_collisions[:3])})"
        if self.kept and self.keep_fields_types == KEEP_FIELDS_STRICT:
            line += f"; kept field types: {', '.join(f'{n} {sample_type(s)}' for n, s in self.kept.items())}"
        return line


def probe_corpus(options: CorpusOptions) -> CorpusProbe:
    """Open the corpus and check its first ``PROBE_RECORDS`` records against ``options``.

    Raises ``CorpusMismatch`` (exit code 2) when nothing matches the path, a file's format is
    unknown, the sampled records do not parse or a file breaks off within them (with
    ``on_bad_file: fail``), a named field is missing from every sampled record, the text field
    holds no text, or the id field holds no usable or mostly repeated ids; ``CorpusError`` when
    storage refuses.
    """
    listing = list_corpus(options)
    root, sources = listing.root, listing.files
    formats = [detect_format(source.path, options.format) for source in sources]
    candidates = [i for i, fmt in enumerate(formats) if fmt.name != "text"] or list(range(len(sources)))
    tried = candidates[:PROBE_FILES]
    for index in tried:
        source, fmt = sources[index], formats[index]
        rows, schema = _sample(root, source, fmt, options)
        if rows:
            return dataclasses.replace(_check(options, len(sources), source, fmt, rows, schema),
                                       left_out=listing.left_out)
    names = ", ".join(sources[i].path for i in tried)
    raise CorpusMismatch(f"no records in the first {len(tried)} file(s) of the corpus ({names}); "
                         "check corpus.path and corpus.format", file=options.path)


def _sample(root: CorpusRoot, source: SourceFile, fmt: FileFormat,
            options: CorpusOptions) -> tuple[list[tuple[Place, Row]], pa.Schema | None]:
    """Up to ``PROBE_RECORDS`` rows of ``source`` with their places, and its schema when it is Parquet."""
    if fmt.name == "text":
        row = read_text(root.fs, source.url, fmt, source.path, options.text_field, options.on_bad_file)
        return [(Place(source.path), row)], None
    schema = parquet_schema(root.fs, source.url, source.path) if fmt.name == "parquet" else None
    columns = DocumentRules.for_format(options, fmt.name).columns()  # only Parquet reads by column
    reading = iter_rows(root.fs, source.url, fmt, source.path, 0, PROBE_RECORDS, columns=columns,
                        on_bad_file=options.on_bad_file)
    with contextlib.closing(reading):
        return [(Place(source.path, number, line), row) for number, line, row in reading], schema


def _check(options: CorpusOptions, files: int, source: SourceFile, fmt: FileFormat, rows: list[tuple[Place, Row]],
           schema: pa.Schema | None) -> CorpusProbe:
    name, count = source.path, len(rows)
    parsed = [(place, row) for place, row in rows if isinstance(row, dict)]
    if not parsed:
        first = rows[0][1].detail if isinstance(rows[0][1], Malformed) else ""
        raise CorpusMismatch(f"none of the first {count} records parses (first: {first}); "
                             "check corpus.format", file=name)
    records = [row for _, row in parsed]
    # the Parquet columns, else the keys seen (a text file's one record holds only the text field)
    fields = (tuple(schema.names) if schema is not None
              else tuple(dict.fromkeys(key for row in records for key in row)))
    rules = DocumentRules.for_format(options, fmt.name)
    _require_fields(rules, fmt, records, schema, name, count)
    items = [rules.to_item(row, place) for place, row in rows]
    _require_text(rules, records, name, count)
    repeated, collisions = _check_ids(rules, parsed, name, count)
    rejects = Counter(item.reason for item in items if isinstance(item, Reject))
    ids = Counter(item.id for item in items if isinstance(item, Document))
    rejects[REJECT_DUPLICATE_ID] += sum(n - 1 for n in ids.values())
    rejects = +rejects  # drop zero counts
    kept = {} if schema is not None else sample_fields(
        {path: [None if (v := lookup(row, path)) is MISSING else v for row in records] for path in rules.keep_fields})
    return CorpusProbe(path=options.path, files=files, sample_file=name, format=fmt.name, records=count,
                       fields=fields, rejects=dict(sorted(rejects.items())), repeated_ids=repeated,
                       id_collisions=collisions, kept=kept, keep_fields_types=options.keep_fields_types)


def _require_fields(rules: DocumentRules, fmt: FileFormat, records: list[dict[str, Any]], schema: pa.Schema | None,
                    name: str, count: int) -> None:
    if fmt.name == "text" and rules.keep_fields:
        raise CorpusMismatch(
            f"a text file is one document without fields, so corpus.keep_fields "
            f"({', '.join(rules.keep_fields)}) can never be filled: remove them", file=name,
            field=rules.keep_fields[0])
    wanted = [(rules.text_field, "set corpus.text_field to the field that holds the text")]
    if rules.id_field:
        wanted.append((rules.id_field, "set corpus.id_field to the field that holds the ids, or leave it "
                                       "unset for ids from the file and row"))
    wanted += [(kept, "fix or remove it in corpus.keep_fields") for kept in rules.keep_fields]
    if rules.title_field:
        wanted.append((rules.title_field, "fix or remove chunking.title_field"))
    for wanted_field, advice in wanted:
        if schema is not None:
            found = schema_type(schema, wanted_field) is not None
        else:
            found = any(lookup(row, wanted_field) is not MISSING for row in records)
        if not found:
            seen = shown(schema_paths(schema) if schema is not None else record_paths(records))
            raise CorpusMismatch(f"no field {wanted_field!r} in the first {count} records (fields seen: {seen}); "
                                 f"{advice}", file=name, field=wanted_field)


def _require_text(rules: DocumentRules, parsed: list[dict[str, Any]], name: str, count: int) -> None:
    values = [lookup(row, rules.text_field) for row in parsed]
    if any(isinstance(value, str) and value.strip() for value in values):
        return
    kinds = sorted({_kind(value) for value in values})
    raise CorpusMismatch(f"field {rules.text_field!r} holds no text in the first {count} records (only "
                         f"{', '.join(kinds)}); set corpus.text_field to the field that holds the text",
                         file=name, field=rules.text_field)


def _check_ids(rules: DocumentRules, parsed: list[tuple[Place, dict[str, Any]]], name: str,
               count: int) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The ids repeated in the sample, and why for those repeated only through the integer rule.

    Raises when the id field holds no usable or mostly repeated ids.
    """
    if not rules.id_field:
        return (), ()
    first: dict[str, IdSeen] = {}
    why: dict[str, str] = {}
    valid = []
    for place, row in parsed:
        doc_id = rules.id_of(row, place)
        if isinstance(doc_id, str):
            valid.append(doc_id)
            here = IdSeen(place, rules.integer_id(row))
            seen = first.setdefault(doc_id, here)
            if seen is not here and seen.integer != here.integer:
                why.setdefault(doc_id, repeated_id(doc_id, seen, here))
    if not valid:
        kinds = sorted({_kind(lookup(row, rules.id_field)) for _, row in parsed})
        raise CorpusMismatch(f"field {rules.id_field!r} holds no usable id in the first {count} records (only "
                             f"{', '.join(kinds)}); ids must be non-empty strings or integers: set "
                             "corpus.id_field to another field, or leave it unset for ids from the file and row",
                             file=name, field=rules.id_field)
    counts = Counter(valid)
    repeated = tuple(doc_id for doc_id, n in counts.items() if n > 1)
    extra = len(valid) - len(counts)
    if extra > MAX_REPEATED_ID_SHARE * len(valid):
        example, times = counts.most_common(1)[0]
        because = f": {why[example]}" if example in why else f", first at {first[example].place.short}"
        raise CorpusMismatch(f"field {rules.id_field!r} does not look like an id: {len(counts)} distinct values "
                             f"in {len(valid)} records ({example!r} {times} times{because}); set corpus.id_field to "
                             "a field unique per document, or leave it unset for ids from the file and row",
                             file=name, field=rules.id_field)
    return repeated, tuple(why.values())


def _kind(value: object) -> str:
    if value is MISSING:
        return "no such field"
    if value is None:
        return "null"
    if isinstance(value, str):
        return "empty strings" if not value.strip() else "text"
    return type(value).__name__
