"""Which reader a source file gets: its format, its compression and, for CSV, its delimiter.

``format: auto`` decides per file by extension after stripping a compression suffix, so a folder may
mix ``.jsonl.gz`` and ``.parquet``; an explicit format applies to every file (compression is still
taken from the extension).
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass

from teibatch.corpus.builtin import is_builtin
from teibatch.corpus.records import FORMATS
from teibatch.errors import CorpusMismatch

FORMAT_BUILTIN = "builtin"
"""The format of a builtin sample corpus's single pseudo-source (see ``builtin.py``)."""

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".xz": "xz", ".zst": "zstd", ".zstd": "zstd"}
"""Compression suffixes (stripped before detection) and the fsspec codec that reads each."""

EXTENSIONS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl",
    ".json": "json",
    ".parquet": "parquet", ".pq": "parquet",
    ".csv": "csv", ".tsv": "csv",
    ".txt": "text", ".md": "text", ".rst": "text", ".html": "text",
}


@dataclass(frozen=True)
class FileFormat:
    """How to read one file: ``name`` (one of ``FORMATS`` or ``builtin``), ``compression`` for
    fsspec (``None`` when plain) and the CSV ``delimiter``."""

    name: str
    compression: str | None = None
    delimiter: str = ","


def detect_format(path: str, requested: str = "auto") -> FileFormat:
    """The format for ``path`` given the job's ``format``; ``CorpusMismatch`` for an unknown extension."""
    if requested not in FORMATS:
        raise CorpusMismatch(f"unknown corpus format {requested!r}; use one of: {', '.join(FORMATS)}")
    if is_builtin(path):
        if requested != "auto":
            raise CorpusMismatch(f"a builtin corpus is read with format: auto, not {requested!r}", file=path)
        return FileFormat(FORMAT_BUILTIN)
    stem, compression = _strip_compression(path)
    extension = posixpath.splitext(stem)[1].lower()
    name = requested if requested != "auto" else EXTENSIONS.get(extension)
    if name is None:
        known = ", ".join(sorted(EXTENSIONS))
        raise CorpusMismatch(
            f"cannot tell the format from the extension {extension or '(none)'!r}; "
            f"known extensions: {known} (optionally compressed: {', '.join(COMPRESSIONS)}); "
            f"or set corpus.format to one of: {', '.join(FORMATS[1:])}", file=path)
    if name == "parquet" and compression is not None:
        raise CorpusMismatch("compressed Parquet files cannot be read; Parquet compresses inside", file=path)
    return FileFormat(name, compression, "\t" if extension == ".tsv" else ",")


def _strip_compression(path: str) -> tuple[str, str | None]:
    stem, extension = posixpath.splitext(path)
    codec = COMPRESSIONS.get(extension.lower())
    return (stem, codec) if codec else (path, None)
