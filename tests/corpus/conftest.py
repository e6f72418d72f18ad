"""Fixtures for the corpus tests: small corpora written to ``tmp_path`` and an S3-compatible server."""

from __future__ import annotations

import bz2
import csv
import gzip
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from teibatch.corpus import CorpusOptions, Document, Reject, plan_shards, read_shard

_OPENERS: dict[str, Callable[[bytes], bytes]] = {
    "": lambda data: data,
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
    ".zstd": lambda data: zstandard.ZstdCompressor().compress(data),
}


def write_jsonl(path: Path, rows: Sequence[dict[str, Any] | str]) -> Path:
    """Write rows as JSON lines (a ``str`` row is written verbatim); compression from the suffix."""
    lines = [row if isinstance(row, str) else orjson.dumps(row).decode() for row in rows]
    data = "".join(line + "\n" for line in lines).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(_OPENERS[path.suffix if path.suffix in _OPENERS else ""](data))
    return path


def write_parquet(path: Path, rows: list[dict[str, Any]], row_group_size: int = 4) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)
    return path


def write_csv(path: Path, header: list[str], rows: list[list[str]], delimiter: str = ",") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream, delimiter=delimiter)
        writer.writerow(header)
        writer.writerows(rows)
    return path


def read_all(options: CorpusOptions) -> list[Document | Reject]:
    """Every item of the corpus, shard after shard, in plan order."""
    return [item for shard in plan_shards(options) for item in read_shard(options, shard)]


def docs(n: int, prefix: str = "d", start: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i}", "text": f"document {prefix}{i}", "n": i} for i in range(start, start + n)]


class CorpusKit:
    """The helpers above, handed to tests by the ``kit`` fixture (tests never import conftest)."""

    write_jsonl = staticmethod(write_jsonl)
    write_parquet = staticmethod(write_parquet)
    write_csv = staticmethod(write_csv)
    read_all = staticmethod(read_all)
    docs = staticmethod(docs)


@pytest.fixture
def kit() -> CorpusKit:
    return CorpusKit()


@pytest.fixture
def mixed_corpus(tmp_path: Path) -> Path:
    """A folder with JSON lines (plain and gzip), a Parquet file, a text file, and files to skip."""
    root = tmp_path / "corpus"
    write_jsonl(root / "a.jsonl", docs(5, "a"))
    write_jsonl(root / "sub" / "b.jsonl.gz", docs(3, "b"))
    write_parquet(root / "c.parquet", docs(6, "c"))
    (root / "notes.txt").write_text("a plain text document", encoding="utf-8")
    (root / "_SUCCESS").write_text("")
    (root / ".hidden.jsonl").write_text('{"id": "h", "text": "hidden"}\n')
    (root / "_tmp").mkdir()
    write_jsonl(root / "_tmp" / "x.jsonl", docs(1, "x"))
    return root
