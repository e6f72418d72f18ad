"""Stream the raw rows of one source file, lazily, with stable row numbers.

One reader per format, each able to *count* a file's rows (planning) and to yield rows
``start``..``stop`` (a shard) without holding the file: JSON lines are split but not parsed before
``start``; Parquet skips whole row groups from its footer. A row is a ``dict`` or a ``Malformed``
marker, numbered from 0 in the file; every physical record counts, malformed ones included, so
counting and reading always agree on the numbers.

This module is the boundary for fsspec, pyarrow and codec errors: they become ``CorpusError``.
"""

from __future__ import annotations

import contextlib
import csv
import io
import lzma
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard
from fsspec.compression import compr
from fsspec.spec import AbstractFileSystem

from teibatch.corpus.builtin import load_builtin
from teibatch.corpus.formats import FORMAT_BUILTIN, FileFormat
from teibatch.corpus.jsonarray import iter_array_items
from teibatch.errors import CorpusError

CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)
"""CSV cells may hold whole documents; the stdlib's default cap (128 KiB) is raised to this."""

_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class Malformed:
    """A physical record that could not be parsed; ``detail`` names the file and line or element."""

    detail: str


Row = dict[str, Any] | Malformed


def count_rows(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str) -> int:
    """How many rows ``url`` holds: Parquet from its footer, builtins from memory, others in one pass."""
    with _errors(name):
        if fmt.name == "parquet":
            with _open(fs, url, fmt) as stream:
                return int(pq.ParquetFile(stream).metadata.num_rows)
        if fmt.name == FORMAT_BUILTIN:
            return len(load_builtin(url).records)
        if fmt.name == "text":
            return 1
        return sum(1 for _ in iter_rows(fs, url, fmt, name, 0, None, parse=False))


def iter_rows(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str, start: int,
              stop: int | None, *, columns: list[str] | None = None,
              parse: bool = True) -> Iterator[tuple[int, Row]]:
    """Yield ``(row_number, row)`` for rows ``start`` up to ``stop`` (``None``: the end).

    ``columns`` limits what Parquet reads; ``parse=False`` (counting) yields empty rows cheaply.
    """
    with _errors(name):
        if fmt.name == FORMAT_BUILTIN:
            records = load_builtin(url).records
            for number in range(start, len(records) if stop is None else min(stop, len(records))):
                yield number, dict(records[number])
            return
        with _open(fs, url, fmt) as stream:
            if fmt.name == "jsonl":
                yield from _jsonl(stream, name, start, stop, parse)
            elif fmt.name == "json":
                yield from _json(stream, name, start, stop, parse)
            elif fmt.name == "csv":
                yield from _csv(stream, name, fmt.delimiter, start, stop)
            elif fmt.name == "parquet":
                yield from _parquet(stream, start, stop, columns)
            else:
                raise CorpusError(f"{name}: format {fmt.name!r} has no row reader")


def read_text(fs: AbstractFileSystem | None, url: str, fmt: FileFormat, name: str) -> str | Malformed:
    """The whole content of a one-document file, or ``Malformed`` when it is not UTF-8."""
    with _errors(name), _open(fs, url, fmt) as stream:
        data = stream.read()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return Malformed(f"{name}: not UTF-8 text: {exc}")


def parquet_schema(fs: AbstractFileSystem | None, url: str, name: str) -> pa.Schema:
    """The Arrow schema of a Parquet file, read from its footer only."""
    with _errors(name), _open(fs, url, FileFormat("parquet")) as stream:
        return pq.ParquetFile(stream).schema_arrow


def _jsonl(stream: Any, name: str, start: int, stop: int | None, parse: bool) -> Iterator[tuple[int, Row]]:
    row = 0
    for line_number, line in enumerate(stream, 1):
        if stop is not None and row >= stop:
            return
        if not line.strip():
            continue  # blank lines are not records
        if row >= start:
            yield row, _parse_object(line.removeprefix(_BOM) if line_number == 1 else line,
                                     f"{name}:{line_number}") if parse else {}
        row += 1


def _json(stream: Any, name: str, start: int, stop: int | None, parse: bool) -> Iterator[tuple[int, Row]]:
    for row, element in enumerate(iter_array_items(stream, name)):
        if stop is not None and row >= stop:
            return
        if row >= start:
            yield row, _parse_object(element, f"{name}: element {row}") if parse else {}


def _parse_object(raw: bytes, where: str) -> Row:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        return Malformed(f"{where}: {exc}")
    if not isinstance(value, dict):
        return Malformed(f"{where}: expected a JSON object, got {type(value).__name__}")
    return value


def _csv(stream: Any, name: str, delimiter: str, start: int, stop: int | None) -> Iterator[tuple[int, Row]]:
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    reader = csv.DictReader(stream, delimiter=delimiter)
    try:
        for row, record in enumerate(reader):
            if stop is not None and row >= stop:
                return
            if row >= start:
                # a short row's missing cells (None) count as absent; extra cells (key None) are dropped
                yield row, {k: v for k, v in record.items() if k is not None and v is not None}
    except csv.Error as exc:
        raise CorpusError(f"{name}:{reader.line_num}: unreadable CSV: {exc}") from exc


def _parquet(stream: Any, start: int, stop: int | None,
             columns: list[str] | None) -> Iterator[tuple[int, Row]]:
    parquet = pq.ParquetFile(stream)
    present = set(parquet.schema_arrow.names)
    wanted = [c for c in dict.fromkeys(columns or []) if c in present] if columns is not None else None
    row = 0
    for group in range(parquet.num_row_groups):
        size = parquet.metadata.row_group(group).num_rows
        if row + size <= start:
            row += size  # skipped from the footer, never read
            continue
        if stop is not None and row >= stop:
            return
        for batch in parquet.iter_batches(row_groups=[group], columns=wanted):
            for record in batch.to_pylist():
                if stop is not None and row >= stop:
                    return
                if row >= start:
                    yield row, record
                row += 1


@contextlib.contextmanager
def _open(fs: AbstractFileSystem | None, url: str, fmt: FileFormat) -> Iterator[Any]:
    """A buffered binary stream (text for CSV), decompressed; every layer is closed on exit."""
    if fs is None:
        raise CorpusError(f"{url}: no filesystem to read it from")
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(fs.open(url, "rb"))
        if fmt.compression is not None:
            stream = compr[fmt.compression](stream, mode="rb")
            stack.callback(stream.close)
            if not isinstance(stream, io.IOBase):  # zstandard's reader cannot iterate lines
                stream = io.BufferedReader(stream)
                stack.callback(stream.close)
        if fmt.name == "csv":
            stream = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
            stack.callback(stream.close)
        yield stream


@contextlib.contextmanager
def _errors(name: str) -> Iterator[None]:
    """Turn storage, codec and Arrow failures into ``CorpusError`` naming the file."""
    try:
        yield
    except FileNotFoundError as exc:
        raise CorpusError(f"{name}: the file is gone (changed since planning?)") from exc
    except UnicodeDecodeError as exc:
        raise CorpusError(f"{name}: not UTF-8 text: {exc}") from exc
    except (OSError, EOFError, lzma.LZMAError, zstandard.ZstdError, pa.ArrowException) as exc:
        raise CorpusError(f"{name}: cannot read: {exc}") from exc
