from __future__ import annotations

import pytest

from teibatch.corpus.formats import FileFormat, detect_format
from teibatch.errors import CorpusError


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        pytest.param("a.jsonl", FileFormat("jsonl"), id="jsonl"),
        pytest.param("a.ndjson", FileFormat("jsonl"), id="ndjson"),
        pytest.param("dir/a.JSONL.gz", FileFormat("jsonl", "gzip"), id="jsonl-gz-uppercase"),
        pytest.param("a.jsonl.zst", FileFormat("jsonl", "zstd"), id="jsonl-zst"),
        pytest.param("a.jsonl.zstd", FileFormat("jsonl", "zstd"), id="jsonl-zstd"),
        pytest.param("a.json.bz2", FileFormat("json", "bz2"), id="json-bz2"),
        pytest.param("a.json.xz", FileFormat("json", "xz"), id="json-xz"),
        pytest.param("a.parquet", FileFormat("parquet"), id="parquet"),
        pytest.param("a.pq", FileFormat("parquet"), id="pq"),
        pytest.param("a.csv", FileFormat("csv"), id="csv"),
        pytest.param("a.tsv.gz", FileFormat("csv", "gzip", "\t"), id="tsv-gz"),
        pytest.param("a.md", FileFormat("text"), id="markdown"),
        pytest.param("a.html", FileFormat("text"), id="html"),
        pytest.param("builtin:stdlib-docs", FileFormat("builtin"), id="builtin"),
    ],
)
def test_auto_detection(path: str, expected: FileFormat) -> None:
    assert detect_format(path) == expected


def test_explicit_format_overrides_extension_but_keeps_compression() -> None:
    assert detect_format("dump.log.gz", "jsonl") == FileFormat("jsonl", "gzip")


@pytest.mark.parametrize(
    ("path", "requested", "message"),
    [
        pytest.param("data/a.xml", "auto", r"data/a\.xml.*'\.xml'.*\.jsonl.*jsonl", id="unknown-extension"),
        pytest.param("README", "auto", r"'\(none\)'", id="no-extension"),
        pytest.param("a.parquet.gz", "auto", "compressed Parquet", id="compressed-parquet"),
        pytest.param("a.jsonl", "yaml", "unknown corpus format", id="unknown-format"),
        pytest.param("builtin:stdlib-docs", "jsonl", "format: auto", id="builtin-needs-auto"),
    ],
)
def test_errors(path: str, requested: str, message: str) -> None:
    with pytest.raises(CorpusError, match=message):
        detect_format(path, requested)
