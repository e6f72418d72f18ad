"""Read CSV and TSV rows strictly, so that one unbalanced quote cannot swallow the rest of a file.

Python's csv module, left lenient, reads a quote that never closes as one value running to the end
of the file: a file of 1,001 rows with a stray quote on row 11 gives 11 rows, the last one holding
990 rows of text. Here the dialect is strict, which raises on a quoted field still open at the end
of the file and on anything but a delimiter or a line end after a closing quote — the two ways a
misplaced quote shows — and never on a well-formed multi-line quoted field. Lines are decoded one
by one, so a bad byte and a bad quote are both reported at their physical line.

A record that does not parse raises ``Unreadable`` naming the line it starts on; with
``reject_rest`` every non-blank line from there to the end of the file becomes one ``Malformed``
row instead (the file's remaining rows, as near as they can be counted without parsing them).
"""

from __future__ import annotations

import csv
import re
import sys
from array import array
from collections.abc import Iterable, Iterator

from teibatch.corpus.rows import Malformed, Place, ReadPosition, Row, Unreadable
from teibatch.errors import CorpusMismatch

CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)
"""CSV cells may hold whole documents; the stdlib's default cap (128 KiB) is raised to this."""

_LONE_CR = re.compile(r"(?<=\r)(?!\n)")
_BOM = "\ufeff"


class _Lines:
    """The physical lines of a binary stream, decoded as UTF-8 one at a time, for ``csv.reader``.

    ``line`` (also kept in ``position.line``) is the number of the last line read; ``record``
    lists the non-blank lines the current record has taken since ``mark()``. Old Mac line ends (a
    lone ``\\r``) are split here, as a text stream opened with ``newline=""`` would.
    """

    def __init__(self, stream: Iterable[bytes], name: str, position: ReadPosition) -> None:
        self._name = name
        self._position = position
        self._pieces = self._read(stream)
        self.line = 0
        self.exhausted = False
        self.record: array[int] = array("q")

    def mark(self) -> None:
        """A new record starts with the next line."""
        self.record = array("q")

    def __iter__(self) -> Iterator[str]:
        return self

    def __next__(self) -> str:
        return next(self._pieces)

    def _read(self, stream: Iterable[bytes]) -> Iterator[str]:
        for raw in stream:
            self.line += 1
            text = self._decode(raw)
            self._position.line = self.line
            if text.strip():
                self.record.append(self.line)
            if "\r" in text:
                yield from (piece for piece in _LONE_CR.split(text) if piece)
            else:
                yield text
        self.exhausted = True

    def _decode(self, raw: bytes) -> str:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise Unreadable(f"not UTF-8 text: byte 0x{raw[exc.start]:02x} at column {exc.start + 1}; "
                             "save the file as UTF-8", file=self._name, line=self.line) from exc
        return text.removeprefix(_BOM) if self.line == 1 else text


def csv_rows(stream: Iterable[bytes], name: str, delimiter: str, start: int, stop: int | None,
             position: ReadPosition, *, reject_rest: bool = False) -> Iterator[tuple[int, int | None, Row]]:
    """Yield ``(row_number, line, row)`` for data rows ``start`` up to ``stop`` of a CSV file with a
    header; ``line`` is the line the record starts on.

    A row maps header names to cells: a short row lacks the missing cells, extra cells are dropped,
    blank lines are not rows. ``position`` follows the reading (see ``ReadPosition``).
    """
    if csv.field_size_limit() < CSV_FIELD_LIMIT:
        csv.field_size_limit(CSV_FIELD_LIMIT)
    lines = _Lines(stream, name, position)
    reader = csv.reader(lines, delimiter=delimiter, strict=True)
    header: list[str] | None = None
    row = 0
    while stop is None or row < stop:
        lines.mark()
        try:
            values = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            first, problem = _describe(exc, lines)
            if not reject_rest:
                raise Unreadable(problem, file=name, line=first) from exc
            yield from _reject_rest(lines, name, first, problem, row, start, stop, position)
            return
        if not values:
            continue
        if header is None:
            header = values
            _check_header(header, name, lines.record[0] if lines.record else lines.line)
            continue
        if row >= start:
            yield row, lines.record[0] if lines.record else lines.line, dict(zip(header, values, strict=False))
        row += 1
        position.row = row


def _check_header(header: list[str], name: str, line: int) -> None:
    """Refuse a header naming one column twice: a row keeps one cell per name, and the other would be
    lost without a word (the text embedded could be either column). Unnamed columns may repeat."""
    seen: dict[str, int] = {}
    for position, column in enumerate(header, start=1):
        if column and column in seen:
            raise CorpusMismatch(f"the header names column {column!r} twice, as columns {seen[column]} and "
                                 f"{position}: a row would keep only one of them; rename one of the two",
                                 file=name, line=line, field=column)
        seen.setdefault(column, position)


def _describe(exc: csv.Error, lines: _Lines) -> tuple[int, str]:
    """The line the bad record starts on, and what went wrong in words a person can act on."""
    first = lines.record[0] if lines.record else lines.line
    if lines.exhausted:
        return first, (f"a quoted field opened in the record on line {first} never closes: the rest of "
                       f"the file (to line {lines.line}) would be read as one value")
    return first, (f"the record on line {first} is not valid CSV ({exc}, line {lines.line}): a quote is "
                   "missing or misplaced, so the rows after it cannot be told apart")


def _reject_rest(lines: _Lines, name: str, first: int, problem: str, row: int, start: int,
                 stop: int | None, position: ReadPosition) -> Iterator[tuple[int, int | None, Row]]:
    """One ``Malformed`` row per non-blank line from the bad record's first line to the end of the file."""
    index = 0
    while stop is None or row < stop:
        while index >= len(lines.record):
            if next(lines, None) is None:
                return
        number = lines.record[index]
        index += 1
        if number == first:
            detail = f"{problem}; this row and every row after it are rejected"
        else:
            detail = f"not read: the CSV record on line {first} does not parse"
        if row >= start:
            yield row, number, Malformed(f"{Place(name, row, number)}: {detail}")
        row += 1
        position.row = row
