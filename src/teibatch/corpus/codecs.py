"""Open a source file as a decompressed byte stream, keeping storage failures apart from bad data.

A decompressor reads the raw file itself, so without care a dropped connection and a truncated
gzip member come out as the same ``OSError``. Here the raw file is wrapped first (``_Storage``):
its own failures become ``CorpusError`` on the spot (the same command may succeed later), so every
error that comes out of a decompressor is about the file's bytes (``CODEC_ERRORS``). Zstandard is
read with its own small reader, because the stream reader of ``zstandard`` ends quietly at a frame
that was cut short; this one raises ``ZstdError`` there, as the gzip, bz2 and xz readers raise
``EOFError``.
"""

from __future__ import annotations

import contextlib
import io
import lzma
import zlib
from collections.abc import Iterator
from typing import Any

import zstandard
from fsspec.compression import compr
from fsspec.spec import AbstractFileSystem

from teibatch.errors import CorpusError

CODEC_ERRORS = (OSError, EOFError, zlib.error, lzma.LZMAError, zstandard.ZstdError)
"""What a decompressor raises on bad data (gzip's ``BadGzipFile`` and bz2's "Invalid data stream"
are ``OSError``s); only meaningful for streams opened by ``open_source``."""

_ZSTD_CHUNK = 1 << 17
_READ_BUFFER = 1 << 16


@contextlib.contextmanager
def open_source(fs: AbstractFileSystem | None, url: str, compression: str | None) -> Iterator[Any]:
    """A buffered binary stream of ``url``, decompressed; every layer is closed on exit."""
    if fs is None:
        raise CorpusError(f"{url}: no filesystem to read it from")
    with contextlib.ExitStack() as stack:
        stream = stack.enter_context(fs.open(url, "rb"))
        if compression is not None:
            raw = _Storage(stream, url)
            # A buffered reader over each decompressor: its readline is C, where gzip's, bz2's and
            # xz's own run Python per line (about twice the cost of reading a JSON-lines file).
            decompressed = _ZstdStream(raw) if compression == "zstd" else compr[compression](raw, mode="rb")
            stream = io.BufferedReader(decompressed, buffer_size=_READ_BUFFER)
            stack.callback(stream.close)
        yield stream


class _Storage(io.RawIOBase):
    """The raw file under a decompressor: its own failures become ``CorpusError`` on the spot."""

    def __init__(self, raw: Any, name: str) -> None:
        super().__init__()
        self._raw = raw
        self._name = name

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def read(self, size: int | None = -1) -> bytes:
        try:
            return bytes(self._raw.read(-1 if size is None else size))
        except FileNotFoundError as exc:
            raise CorpusError(f"{self._name}: the file is gone (changed since planning?)") from exc
        except OSError as exc:
            raise CorpusError(f"{self._name}: storage refused: {exc}") from exc


class _ZstdStream(io.RawIOBase):
    """Zstandard frames, one after another, decompressed; a frame cut short raises ``ZstdError``."""

    def __init__(self, raw: io.RawIOBase) -> None:
        super().__init__()
        self._raw = raw
        self._context = zstandard.ZstdDecompressor()
        self._frame = self._context.decompressobj()
        self._in_frame = False  # the current frame has had input and has not ended
        self._out = b""
        self._at = 0  # what of _out was read: a position, as cutting the rest off would copy it each read
        self._done = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        while self._at == len(self._out) and not self._done:
            self._out, self._at = b"", 0
            self._fill()
        size = min(len(buffer), len(self._out) - self._at)
        buffer[:size] = memoryview(self._out)[self._at:self._at + size]
        self._at += size
        return size

    def _fill(self) -> None:
        chunk = self._raw.read(_ZSTD_CHUNK)
        if not chunk:
            if self._in_frame:
                raise zstandard.ZstdError("the file ends inside a zstd frame (truncated)")
            self._done = True
            return
        while chunk:
            self._out += self._frame.decompress(chunk)
            self._in_frame = not self._frame.eof
            chunk = b""
            if self._frame.eof:  # a frame ended: what follows it starts the next one
                chunk = self._frame.unused_data
                self._frame = self._context.decompressobj()
