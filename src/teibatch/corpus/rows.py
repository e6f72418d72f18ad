"""What a reader yields (rows, ``Malformed`` markers, their ``Place``) and how it says a file breaks off.

Shared by the format readers (``readers.py``, ``csvfile.py``, ``jsonarray.py``) so that every one
of them reports a file it cannot read past some point the same way: by raising ``Unreadable``,
which ``readers.iter_rows`` turns into a ``CorpusMismatch`` or, with ``on_bad_file: reject``,
into ``Malformed`` rows for what cannot be read.

One numbering for rows: a row's place is ``<file>#<row>``, rows counted from 0 in each file,
malformed ones included — the positional id a row takes when the job sets no ``id_field`` — and
the formats with lines (JSON lines, CSV) add the line a person opens: ``c.jsonl#1 (line 2)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from teibatch.errors import CorpusMismatch


@dataclass(frozen=True)
class Place:
    """Where a row is: its file (relative to the corpus root), its row number (``None`` for a file
    that is one document) and, for formats with lines, the line its record starts on."""

    path: str
    row: int | None = None
    line: int | None = None

    @property
    def id(self) -> str:
        """The row's positional id: ``<file>#<row>``, or the file for a one-document file."""
        return self.path if self.row is None else f"{self.path}#{self.row}"

    @property
    def short(self) -> str:
        """The place within its file, for a message that has named the file: ``line 2`` or ``row 5``."""
        return f"line {self.line}" if self.line is not None else f"row {self.row}"

    def __str__(self) -> str:
        return self.id + (f" (line {self.line})" if self.line is not None else "")


@dataclass(frozen=True)
class Malformed:
    """A physical record that could not be parsed; ``detail`` names its place and what is wrong.

    ``record`` is what a lenient reading of it still gave (a JSON line whose only fault is text
    that is not valid Unicode), so that its reject can carry the record's own id.
    """

    detail: str
    record: dict[str, Any] | None = field(default=None, compare=False)


Row = dict[str, Any] | Malformed


@dataclass
class ReadPosition:
    """How far a reader got in one file: ``row`` is the number the next row gets, ``line`` the last
    physical line read (line formats only) and ``total`` the file's row count when its footer says."""

    row: int = 0
    line: int | None = None
    total: int | None = None


class Unreadable(CorpusMismatch):
    """Raised inside a reader: ``file`` cannot be read past ``line``; ``problem`` says why.

    It never leaves ``iter_rows`` as itself: callers see a plain ``CorpusMismatch`` or rejects.
    """

    def __init__(self, problem: str, *, file: str, line: int | None = None) -> None:
        self.problem = problem
        super().__init__(problem, file=file, line=line)
