"""Stream the raw rows of one source file, lazily, with stable row numbers.

One reader per format, each able to *count* a file's rows (planning) and to yield rows
``start``..``stop`` (a shard) without holding the file: an uncompressed JSON-lines file is read from
where planning marked the shard's first row (``count_and_mark``), others are split but not parsed
before ``start``; Parquet skips whole row groups from its footer. A row is a ``dict`` or a ``Malformed``
marker, numbered from 0 in the file; every physical record counts, malformed ones included, so
counting and reading always agree on the numbers. A malformed row's detail starts with its place
(``rows.Place``): ``c.jsonl#1 (line 2): …``.

A JSON record that orjson refuses only because its text is not valid Unicode (a lone surrogate
such as ``"\\ud800"``, or a byte that is not UTF-8) is still malformed, but is read again leniently
so that its reject can carry the record's own id and name the field that holds the bad text.

This module is the boundary for fsspec, pyarrow and codec errors. Storage failures (a refused or
lost connection, a file gone) become ``CorpusError``: the same command may succeed later. A file
whose *content* cannot be read past some point — compressed data that is corrupt or truncated, a
CSV quote that never closes, bytes that are not UTF-8 where text is expected, a Parquet file that
is not one — becomes ``CorpusMismatch`` naming the file and, where known, the line; or, with
``on_bad_file: reject``, the rows before that point are read as usual and what cannot be read
becomes ``Malformed`` rows (one per remaining line of a CSV file, one for the unreadable rest of
any other file, one per remaining row of a Parquet shard).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Generator, Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
from fsspec.spec import AbstractFileSystem

from teibatch.corpus.builtin import load_builtin
from teibatch.corpus.codecs import CODEC_ERRORS, open_source
from teibatch.corpus.csvfile import csv_rows
from teibatch.corpus.formats import FORMAT_BUILTIN, FileFormat
from teibatch.corpus.jsonarray import iter_array_items
from teibatch.corpus.paths import top_column
from teibatch.corpus.records import ON_BAD_FILE_FAIL, ON_BAD_FILE_REJECT, RowMark
from teibatch.corpus.rows import Malformed, Place, ReadPosition, Row, Unreadable
from teibatch.errors import CorpusError, CorpusMismatch

BAD_FILE_HINT = ("fix or replace the file, or set corpus.on_bad_file: reject to keep the rows before "
                 "this point and reject the rest")

_BOM = b"\xef\xbb\xbf"
_PARQUET_BATCH = 65_536


def count_rows(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str,
               on_bad_file: str = ON_BAD_FILE_FAIL) -> int:
    """How many rows ``url`` (a row format; a ``text`` file is one document) holds: Parquet from its
    footer, builtins from memory, others in one pass.

    A file that cannot be read to its end raises ``CorpusMismatch`` (``on_bad_file: fail``), or
    counts the ``Malformed`` rows that reading it will yield (``reject``).
    """
    if fmt.name == "parquet":
        try:
            with _errors(name, fmt, ReadPosition()), open_source(fs, url, fmt.compression) as stream:
                return int(pq.ParquetFile(stream).metadata.num_rows)
        except Unreadable as exc:
            if on_bad_file != ON_BAD_FILE_REJECT:
                raise _bad_file(exc) from exc
            return 1  # reading it yields one Malformed row for the whole file
    if fmt.name == FORMAT_BUILTIN:
        return len(load_builtin(url).records)
    return sum(1 for _ in iter_rows(fs, url, fmt, name, 0, None, parse=False, on_bad_file=on_bad_file))


def can_mark(fmt: FileFormat) -> bool:
    """Whether reading ``fmt`` can start at a :class:`RowMark` (JSON lines, not compressed)."""
    return fmt.name == "jsonl" and fmt.compression is None


def count_and_mark(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str,
                   every: int) -> tuple[int, dict[int, RowMark]]:
    """:func:`count_rows` for a file :func:`can_mark`, with a :class:`RowMark` at every ``every``-th
    row (0 included), by row; the same pass, counting rows as :func:`iter_rows` numbers them."""
    if not can_mark(fmt) or every < 1:
        raise ValueError(f"{name}: only uncompressed JSON lines are marked, at a positive interval")
    marks: dict[int, RowMark] = {}
    position = ReadPosition()
    row = offset = 0
    with _errors(name, fmt, position), open_source(fs, url, fmt.compression) as stream:
        for line_number, line in enumerate(stream, 1):
            position.line = line_number
            if not line.isspace():  # as _jsonl: blank lines are not rows
                if row % every == 0:
                    marks[row] = RowMark(row, offset, line_number - 1)
                row += 1
                position.row = row
            offset += len(line)
    return row, marks


def iter_rows(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str, start: int,
              stop: int | None, *, columns: list[str] | None = None, parse: bool = True,
              on_bad_file: str = ON_BAD_FILE_FAIL,
              mark: RowMark | None = None) -> Generator[tuple[int, int | None, Row], None, None]:
    """Yield ``(row_number, line, row)`` for rows ``start`` up to ``stop`` (``None``: the end).

    ``line`` is the line the record starts on (JSON lines, CSV), else ``None``. ``columns`` (field
    paths) limits what Parquet reads: a nested path reads its whole top-level column;
    ``parse=False`` (counting) yields empty rows cheaply. ``mark`` (from :func:`count_and_mark`, at
    or before ``start``): where in the file to begin, when the file :func:`can_mark`.
    A file whose content breaks off raises ``CorpusMismatch`` naming the file and line, or with
    ``on_bad_file: reject`` yields ``Malformed`` rows for what cannot be read (see the module doc).
    """
    if fmt.name == FORMAT_BUILTIN:
        records = load_builtin(url).records
        for number in range(start, len(records) if stop is None else min(stop, len(records))):
            yield number, None, dict(records[number])
        return
    reject = on_bad_file == ON_BAD_FILE_REJECT
    position = ReadPosition()
    try:
        with _errors(name, fmt, position), open_source(fs, url, fmt.compression) as stream:
            if fmt.name == "jsonl":
                if mark is not None and mark.row <= start and can_mark(fmt) and stream.seekable():
                    stream.seek(mark.offset)
                else:
                    mark = None
                yield from _jsonl(stream, name, start, stop, parse, position, mark)
            elif fmt.name == "json":
                yield from _json(stream, name, start, stop, parse, position)
            elif fmt.name == "csv":
                yield from csv_rows(stream, name, fmt.delimiter, start, stop, position, reject_rest=reject)
            elif fmt.name == "parquet":
                yield from _parquet(stream, start, stop, columns, position)
            else:
                raise CorpusError(f"{name}: format {fmt.name!r} has no row reader")
    except Unreadable as exc:
        if not reject:
            raise _bad_file(exc) from exc
        yield from _rejected_rest(exc, position, start, stop)


def read_text(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str, text_field: str,
              on_bad_file: str = ON_BAD_FILE_FAIL) -> Row:
    """A one-document file as a row, its whole content in ``text_field``; ``Malformed`` when it is not UTF-8.

    Compressed content that is corrupt raises ``CorpusMismatch`` (``on_bad_file: fail``) or is
    ``Malformed`` too (``reject``).
    """
    try:
        with _errors(name, fmt, ReadPosition()), open_source(fs, url, fmt.compression) as stream:
            data = stream.read()
    except Unreadable as exc:
        if on_bad_file != ON_BAD_FILE_REJECT:
            raise _bad_file(exc) from exc
        return Malformed(str(exc))
    try:
        return {text_field: data.decode("utf-8-sig")}
    except UnicodeDecodeError as exc:
        return Malformed(f"{name}: not UTF-8 text: {exc}")


def parquet_schema(fs: AbstractFileSystem | None, url: str, name: str) -> pa.Schema:
    """The Arrow schema of a Parquet file, read from its footer only."""
    fmt = FileFormat("parquet")
    try:
        with _errors(name, fmt, ReadPosition()), open_source(fs, url, fmt.compression) as stream:
            return pq.ParquetFile(stream).schema_arrow
    except Unreadable as exc:
        raise CorpusMismatch(exc.problem, file=exc.file, line=exc.line) from exc


def _bad_file(exc: Unreadable) -> CorpusMismatch:
    """The error a caller sees for a file that breaks off (``on_bad_file: fail``)."""
    return CorpusMismatch(f"{exc.problem}; {BAD_FILE_HINT}", file=exc.file, line=exc.line)


def _jsonl(stream: Any, name: str, start: int, stop: int | None, parse: bool,
           position: ReadPosition, mark: RowMark | None = None) -> Iterator[tuple[int, int | None, Row]]:
    """Rows of a JSON-lines ``stream``, which is at ``mark`` (else at its start)."""
    position.row = mark.row if mark is not None else 0
    position.line = mark.line if mark is not None else 0
    if start > position.row:
        _skip_rows(stream, start - position.row, position)
    row = position.row
    loads, decode_error = orjson.loads, orjson.JSONDecodeError
    for line_number, line in enumerate(stream, position.line + 1):
        position.line = line_number
        if stop is not None and row >= stop:
            return
        if line.isspace():  # a line read from a stream is never empty
            continue  # blank lines are not records
        if row >= start:
            if not parse:
                yield row, line_number, {}
            else:
                try:  # the common record, parsed in place; anything else (a BOM too) gets _parse_object's care
                    value = loads(line)
                except decode_error:
                    value = None
                if type(value) is dict:
                    yield row, line_number, value
                else:
                    yield row, line_number, _parse_object(line.removeprefix(_BOM) if line_number == 1 else line,
                                                          name, row, line_number)
        row += 1
        position.row = row


def _skip_rows(stream: Any, rows: int, position: ReadPosition) -> None:
    """Read past the next ``rows`` rows of a JSON-lines ``stream`` (at a line's start), counting them and
    their lines in ``position``; fewer where the file ends first.

    The rows before a shard of a file that cannot be sought (a compressed one) are read again for
    every shard of the file: here they cost a loop that only counts.
    """
    lines = skipped = 0
    try:
        for line in stream:
            lines += 1
            if not line.isspace():  # as _jsonl: blank lines are not rows
                skipped += 1
                if skipped == rows:
                    return
    finally:  # also where the file breaks off: the error names the line after the last one read
        position.line = (position.line or 0) + lines
        position.row += skipped


def _json(stream: Any, name: str, start: int, stop: int | None, parse: bool,
          position: ReadPosition) -> Iterator[tuple[int, int | None, Row]]:
    for row, element in enumerate(iter_array_items(stream, name)):
        if stop is not None and row >= stop:
            return
        if row >= start:
            yield row, None, _parse_object(element, name, row) if parse else {}
        position.row = row + 1


def _parse_object(raw: bytes, name: str, row: int, line: int | None = None) -> Row:
    """Row ``row`` of file ``name`` (on ``line``) parsed: a JSON object, or ``Malformed`` saying where and why."""
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        record = _lenient(raw)
        bad = None if record is None else _bad_text(record)
        if record is None or bad is None:
            return Malformed(f"{Place(name, row, line)}: {exc}")
        return Malformed(f"{Place(name, row, line)}: {bad}", record)
    if not isinstance(value, dict):
        return Malformed(f"{Place(name, row, line)}: expected a JSON object, got {type(value).__name__}")
    return value


def _lenient(raw: bytes) -> dict[str, Any] | None:
    """``raw`` read by Python's own JSON parser, which lets text that is not valid Unicode through
    (bytes that are not UTF-8 become lone surrogates); ``None`` when that fails too."""
    try:
        value = json.loads(raw.decode("utf-8", "surrogateescape"), parse_constant=_no_constant)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _bad_text(value: Any, path: str = "") -> str | None:
    """Where ``value`` holds text that is not valid Unicode, in words; ``None`` when nowhere."""
    if isinstance(value, str):
        for index, char in enumerate(value):
            if "\ud800" <= char <= "\udfff":
                return (f"field {path!r} holds text that is not valid Unicode (a lone surrogate {char!a} "
                        f"or a byte that is not UTF-8) at character {index}")
        return None
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, inner in items:
        if isinstance(key, str) and (found := _bad_text(key, path)) is not None:
            return found.replace("holds text", "has a key", 1)
        found = _bad_text(inner, f"{path}.{key}" if path else str(key))
        if found is not None:
            return found
    return None


def _parquet(stream: Any, start: int, stop: int | None, columns: list[str] | None,
             position: ReadPosition) -> Iterator[tuple[int, int | None, Row]]:
    parquet = pq.ParquetFile(stream)
    position.total = parquet.metadata.num_rows
    present = parquet.schema_arrow.names
    wanted = None
    if columns is not None:
        tops = (top_column(path, present) for path in columns)
        wanted = list(dict.fromkeys(top for top in tops if top is not None))
    batch_size = _PARQUET_BATCH if stop is None else max(1, min(_PARQUET_BATCH, stop - start))
    row = 0
    for group in range(parquet.num_row_groups):
        size = parquet.metadata.row_group(group).num_rows
        if row + size <= start:
            row += size  # skipped from the footer, never read
            position.row = row
            continue
        if stop is not None and row >= stop:
            return
        for batch in parquet.iter_batches(batch_size=batch_size, row_groups=[group], columns=wanted):
            for record in batch.to_pylist():
                if stop is not None and row >= stop:
                    return
                if row >= start:
                    yield row, None, record
                row += 1
                position.row = row


def _rejected_rest(exc: Unreadable, position: ReadPosition, start: int,
                   stop: int | None) -> Iterator[tuple[int, int | None, Row]]:
    """``on_bad_file: reject``: what could not be read, as ``Malformed`` rows.

    A Parquet file's footer says how many rows it has, so each one left becomes a reject; a stream
    that breaks off gives one reject for its unreadable rest. CSV files reject line by line
    themselves (``csvfile.py``) and only reach here when the bytes themselves are bad.
    """
    where = f" (line {exc.line})" if exc.line else ""
    detail = f"{exc.problem}{where}; the rest of the file cannot be read"
    end = position.total if position.total is not None else position.row + 1
    for row in range(max(start, position.row), end if stop is None else min(stop, end)):
        yield row, None, Malformed(f"{Place(exc.file or '', row)}: {detail}")


@contextlib.contextmanager
def _errors(name: str, fmt: FileFormat, position: ReadPosition) -> Iterator[None]:
    """Turn storage failures into ``CorpusError`` and bad content into ``Unreadable``, naming the file."""
    try:
        yield
    except CorpusError:
        raise
    except FileNotFoundError as exc:
        raise CorpusError(f"{name}: the file is gone (changed since planning?)") from exc
    except UnicodeDecodeError as exc:
        raise Unreadable(f"not UTF-8 text: {exc}", file=name, line=_next_line(position)) from exc
    except pa.ArrowException as exc:  # an ArrowIOError is a plain OSError: storage, below
        raise Unreadable(f"not a readable Parquet file {_where(position)}: {exc}", file=name) from exc
    except CODEC_ERRORS as exc:
        if fmt.compression is None:  # no decompressor: an OSError is the storage's
            if isinstance(exc, OSError):
                raise CorpusError(f"{name}: storage refused: {exc}") from exc
            raise
        raise Unreadable(f"the {fmt.compression} data is corrupt or truncated {_where(position)} "
                         f"({type(exc).__name__}: {exc})", file=name, line=_next_line(position)) from exc


def _next_line(position: ReadPosition) -> int | None:
    return None if position.line is None else position.line + 1


def _where(position: ReadPosition) -> str:
    if position.line is not None:
        return f"after line {position.line}" if position.line else "from its start"
    return f"after row {position.row}" if position.row else "from its start"
