"""What a reader yields (rows and ``Malformed`` markers) and how it says a file breaks off.

Shared by the format readers (``readers.py``, ``csvfile.py``, ``jsonarray.py``) so that every one
of them reports a file it cannot read past some point the same way: by raising ``Unreadable``,
which ``readers.iter_rows`` turns into a ``CorpusMismatch`` or, with ``on_bad_file: reject``,
into ``Malformed`` rows for what cannot be read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from teibatch.errors import CorpusMismatch


@dataclass(frozen=True)
class Malformed:
    """A physical record that could not be parsed; ``detail`` names the file and line or element."""

    detail: str


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
