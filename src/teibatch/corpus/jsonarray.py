"""Split a JSON document's list into its elements without loading the document.

A ``.json`` corpus file is either a top-level array of objects or an object holding one list
(``{"version": 2, "docs": [...]}``). ``iter_array_items`` scans the bytes in chunks, tracking only
bracket depth and string boundaries, and yields each element's raw bytes; the caller parses each
with orjson, so one malformed element becomes one reject and memory stays at one element plus a
chunk, whatever the file size.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import BinaryIO

from teibatch.corpus.rows import Unreadable

CHUNK_BYTES = 1 << 20

_STRUCTURAL = re.compile(rb'[\[\]{},"]')
_STRING_REST = re.compile(rb'[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_FIRST_VALUE = re.compile(rb"\s*(\S)")
_OPEN = {ord("["): ord("]"), ord("{"): ord("}")}


class _Scanner:
    """A growing window over the stream; a refill drops what lies before the open element or the scan position."""

    def __init__(self, stream: BinaryIO, chunk: int) -> None:
        self.stream = stream
        self.chunk = chunk
        self.buf = bytearray()
        self.eof = False
        self.dropped = 0  # bytes of the stream before buf[0]

    def refill(self, pos: int, item: int | None) -> tuple[int, int | None] | None:
        """Read one more chunk, dropping the bytes before ``item`` (or ``pos`` when ``item`` is ``None``);
        returns ``pos`` and ``item`` moved with the bytes they point at, or ``None`` at EOF."""
        if self.eof:
            return None
        data = self.stream.read(self.chunk)
        if not data:
            self.eof = True
            return None
        keep = pos if item is None else item
        del self.buf[:keep]
        self.dropped += keep
        self.buf += data
        return pos - keep, None if item is None else item - keep


def iter_array_items(stream: BinaryIO, name: str, chunk: int = CHUNK_BYTES) -> Iterator[bytes]:
    """Yield the raw bytes of each element of the file's list, in order; ``name`` is for errors.

    Raises ``Unreadable`` (a ``CorpusMismatch``) when the file is not a JSON array or an object with
    exactly one list, or when its brackets or strings do not close: then no row numbering of the
    file past that point can be trusted.
    """
    scan = _Scanner(stream, chunk)
    pos = 0
    while (first := _FIRST_VALUE.match(scan.buf, pos)) is None:
        if scan.refill(pos, None) is None:
            raise Unreadable("empty JSON file; expected an array or an object holding a list", file=name)
    if scan.buf[first.start(1)] not in _OPEN:
        raise Unreadable("a .json corpus file must hold an array or an object with one list", file=name)
    stack: list[int] = []
    target: int | None = None  # stack depth at which the list's elements live
    done = False
    item: int | None = None  # where the current element starts
    pos = first.start(1)
    while True:
        match = _STRUCTURAL.search(scan.buf, pos)
        if match is None:
            moved = scan.refill(pos, item)
            if moved is None:
                break
            pos, item = moved
            continue
        char, pos = scan.buf[match.start()], match.end()
        if char == ord('"'):
            while (end := _STRING_REST.match(scan.buf, pos)) is None:
                moved = scan.refill(pos, item)
                if moved is None:
                    raise Unreadable("the file ends inside a string", file=name)
                pos, item = moved
            pos = end.end()
        elif char in _OPEN:
            stack.append(char)
            opens_list = char == ord("[") and (len(stack) == 1 or (len(stack) == 2 and stack[0] == ord("{")))
            if opens_list:
                if done:
                    raise Unreadable("the JSON object holds more than one list; keep one", file=name)
                target, item = len(stack), pos
        elif char == ord(","):
            if item is not None and len(stack) == target:
                element = bytes(scan.buf[item:match.start()]).strip()
                if element:
                    yield element
                item = pos
        else:  # closing bracket
            if not stack or _OPEN[stack[-1]] != char:
                raise Unreadable(f"unbalanced brackets near byte offset {scan.dropped + match.start()}", file=name)
            if item is not None and len(stack) == target:
                element = bytes(scan.buf[item:match.start()]).strip()
                if element:
                    yield element
                item, done = None, True
            stack.pop()
            if not stack:
                break
    if stack:
        raise Unreadable("the file ends before its JSON value closes", file=name)
    if not done:
        raise Unreadable("the JSON object holds no list of records", file=name)
