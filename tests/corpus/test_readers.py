from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import orjson
import pytest

from teibatch.corpus import CorpusOptions, Document, plan_shards
from teibatch.corpus.formats import FileFormat
from teibatch.corpus.listing import resolve_root
from teibatch.corpus.readers import count_rows, iter_rows
from teibatch.errors import CorpusError, CorpusMismatch

ROWS = [{"id": f"r{i}", "text": f"row {i} text", "n": i} for i in range(10)]


def ids_and_texts(kit: Any, options: CorpusOptions) -> list[tuple[str, str]]:
    items = kit.read_all(options)
    assert all(isinstance(item, Document) for item in items), items
    return [(item.id, item.text) for item in items]


EXPECTED = [(row["id"], row["text"]) for row in ROWS]


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("c.jsonl", id="jsonl"),
        pytest.param("c.ndjson", id="ndjson"),
        pytest.param("c.jsonl.gz", id="jsonl-gz"),
        pytest.param("c.jsonl.zst", id="jsonl-zst"),
        pytest.param("c.jsonl.zstd", id="jsonl-zstd"),
        pytest.param("c.jsonl.bz2", id="jsonl-bz2"),
    ],
)
def test_json_lines(kit: Any, tmp_path: Path, name: str) -> None:
    path = kit.write_jsonl(tmp_path / name, ROWS)
    assert ids_and_texts(kit, CorpusOptions(str(path), id_field="id", shard_docs=4)) == EXPECTED


@pytest.mark.parametrize(
    "document",
    [pytest.param(ROWS, id="array"), pytest.param({"count": 10, "records": ROWS}, id="object-with-list")],
)
def test_json_document(kit: Any, tmp_path: Path, document: object) -> None:
    path = tmp_path / "c.json"
    path.write_bytes(orjson.dumps(document, option=orjson.OPT_INDENT_2))
    assert ids_and_texts(kit, CorpusOptions(str(path), id_field="id", shard_docs=3)) == EXPECTED


def test_parquet_with_many_row_groups(kit: Any, tmp_path: Path) -> None:
    path = kit.write_parquet(tmp_path / "c.parquet", ROWS, row_group_size=3)
    options = CorpusOptions(str(path), id_field="id", shard_docs=4)
    assert [(s.start, s.stop) for s in plan_shards(options)] == [(0, 4), (4, 8), (8, 10)]
    assert ids_and_texts(kit, options) == EXPECTED


def test_parquet_reads_only_needed_columns_and_row_groups(kit: Any, tmp_path: Path) -> None:
    path = kit.write_parquet(tmp_path / "c.parquet", ROWS, row_group_size=3)
    root = resolve_root(CorpusOptions(str(path)))
    fmt = FileFormat("parquet")
    rows = list(iter_rows(root.fs, str(path), fmt, "c.parquet", 5, 7, columns=["text", "x"]))
    assert rows == [(5, None, {"text": "row 5 text"}), (6, None, {"text": "row 6 text"})]


@pytest.mark.parametrize(
    ("name", "delimiter"),
    [pytest.param("c.csv", ",", id="csv"), pytest.param("c.tsv", "\t", id="tsv")],
)
def test_csv_and_tsv(kit: Any, tmp_path: Path, name: str, delimiter: str) -> None:
    rows = [[r["id"], r["text"], str(r["n"])] for r in ROWS]
    rows[3][1] = 'multi-line,\n"quoted"\tcell'
    path = kit.write_csv(tmp_path / name, ["id", "text", "n"], rows, delimiter)
    options = CorpusOptions(str(path), id_field="id", keep_fields=("n",), shard_docs=4)
    items = kit.read_all(options)
    assert [(d.id, d.text) for d in items] == [(r[0], r[1]) for r in rows]
    assert items[9].fields == {"n": "9"}


def test_csv_cells_may_be_whole_documents(kit: Any, tmp_path: Path) -> None:
    long_text = "word " * 100_000
    path = kit.write_csv(tmp_path / "c.csv", ["text"], [[long_text]])
    assert [d.text for d in kit.read_all(CorpusOptions(str(path)))] == [long_text]


def test_text_files_one_document_each(kit: Any, tmp_path: Path) -> None:
    (tmp_path / "docs" / "deep").mkdir(parents=True)
    (tmp_path / "docs" / "a.md").write_text("# Title\n\nbody", encoding="utf-8")
    (tmp_path / "docs" / "deep" / "b.txt").write_bytes(b"\xef\xbb\xbfwith a BOM")
    options = CorpusOptions(str(tmp_path / "docs"), id_field="ignored", shard_docs=1)
    assert ids_and_texts(kit, options) == [("a.md", "# Title\n\nbody"), ("deep/b.txt", "with a BOM")]


def test_blank_lines_are_not_rows(kit: Any, tmp_path: Path) -> None:
    path = kit.write_jsonl(tmp_path / "c.jsonl", ["", '{"text": "a"}', "   ", '{"text": "b"}', ""])
    root = resolve_root(CorpusOptions(str(path)))
    assert count_rows(root.fs, str(path), FileFormat("jsonl"), "c.jsonl") == 2
    assert ids_and_texts(kit, CorpusOptions(str(path))) == [("c.jsonl#0", "a"), ("c.jsonl#1", "b")]


def test_unknown_extension_in_a_folder_fails_before_reading(kit: Any, tmp_path: Path) -> None:
    kit.write_jsonl(tmp_path / "a.jsonl", ROWS)
    (tmp_path / "b.xml").write_text("<x/>")
    with pytest.raises(CorpusError, match=r"b\.xml.*known extensions"):
        plan_shards(CorpusOptions(str(tmp_path)))


@pytest.mark.parametrize(
    ("name", "data"),
    [
        pytest.param("c.jsonl.gz", b"not gzip at all", id="corrupt-gzip"),
        pytest.param("c.jsonl.zst", b"not zstd at all", id="corrupt-zstd"),
        pytest.param("c.parquet", b"not parquet", id="corrupt-parquet"),
        pytest.param("c.csv", b"text\n\xff\xfe broken", id="csv-not-utf8"),
    ],
)
def test_unreadable_files_fail_their_shard_with_corpus_mismatch(kit: Any, tmp_path: Path, name: str,
                                                                data: bytes) -> None:
    # planning goes on (the file gets one shard); reading that shard names the file
    (tmp_path / name).write_bytes(data)
    (shard,) = plan_shards(CorpusOptions(str(tmp_path / name)))
    assert shard.bad_file is not None and shard.bad_file.file == name
    with pytest.raises(CorpusMismatch, match=name.replace(".", r"\.")) as caught:
        kit.read_all(CorpusOptions(str(tmp_path / name)))
    assert caught.value.file == name
    assert caught.value.exit_code == 2


def _compressed(suffix: str, data: bytes) -> bytes:
    import bz2
    import gzip
    import lzma

    import zstandard
    codecs = {".gz": gzip.compress, ".bz2": bz2.compress, ".xz": lzma.compress,
              ".zst": zstandard.ZstdCompressor().compress}
    return codecs[suffix](data)


LINES = b"".join(orjson.dumps({"id": f"r{i}", "text": f"text {i} " * 20}) + b"\n" for i in range(3000))


@pytest.mark.parametrize("suffix", [pytest.param(s, id=s[1:]) for s in (".gz", ".bz2", ".xz", ".zst")])
def test_truncated_compressed_file_names_file_and_line(kit: Any, tmp_path: Path, suffix: str) -> None:
    data = _compressed(suffix, LINES)
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(data[: len(data) * 2 // 3])
    options = CorpusOptions(str(path), id_field="id", shard_docs=1000)
    (shard,) = plan_shards(options)
    assert shard.bad_file is not None
    with pytest.raises(CorpusMismatch, match=r"corrupt or truncated (after line|from its start)") as caught:
        kit.read_all(options)
    error = caught.value
    assert error.file == path.name and error.line is not None and 1 <= error.line <= 3000
    assert "on_bad_file: reject" in str(error)

    rejecting = CorpusOptions(str(path), id_field="id", shard_docs=1000, on_bad_file="reject")
    items = kit.read_all(rejecting)
    assert [type(item).__name__ for item in items] == ["Document"] * (len(items) - 1) + ["Reject"]
    assert [item.id for item in items[:-1]] == [f"r{i}" for i in range(len(items) - 1)]
    last = items[-1]
    assert last.reason == "malformed_record" and last.detail.startswith(f"{path.name}#{len(items) - 1}: ")
    assert f"(line {len(items)})" in last.detail


@pytest.mark.parametrize("suffix", [pytest.param(s, id=s[1:]) for s in (".gz", ".zst")])
@pytest.mark.parametrize("keep", [pytest.param(1.0, id="whole"), pytest.param(2 / 3, id="truncated")])
def test_shards_of_a_compressed_file_read_what_one_shard_reads(kit: Any, tmp_path: Path, suffix: str,
                                                               keep: float) -> None:
    # A shard of a compressed file counts its way past the rows before it (no seeking): blank lines,
    # and the unreadable rest of a truncated file, come out as when one shard reads the whole file.
    data = _compressed(suffix, LINES.replace(b"\n", b"\n\n  \n", 7))
    path = tmp_path / f"c.jsonl{suffix}"
    path.write_bytes(data[: int(len(data) * keep)])
    one = kit.read_all(CorpusOptions(str(path), id_field="id", shard_docs=100_000, on_bad_file="reject"))
    many = kit.read_all(CorpusOptions(str(path), id_field="id", shard_docs=700, on_bad_file="reject"))
    assert many == one
    assert len(one) > 1000
    assert [type(item).__name__ for item in one[-2:]] == ["Document", "Reject" if keep < 1 else "Document"]


def test_zstd_files_of_several_frames_read_whole(kit: Any, tmp_path: Path) -> None:
    import zstandard
    first, second = LINES[:100_000], LINES[100_000:]
    frames = zstandard.ZstdCompressor().compress(first) + zstandard.ZstdCompressor().compress(second)
    (tmp_path / "c.jsonl.zst").write_bytes(frames)
    items = kit.read_all(CorpusOptions(str(tmp_path / "c.jsonl.zst"), id_field="id"))
    assert [item.id for item in items] == [f"r{i}" for i in range(3000)]


def test_storage_failures_stay_corpus_errors_not_mismatches() -> None:
    """A read the storage refuses (the same command may work later) is not blamed on the file."""
    data = _compressed(".gz", LINES)

    class Flaky(io.BytesIO):
        def read(self, size: int | None = -1) -> bytes:
            if self.tell() > len(data) // 2:
                raise ConnectionResetError("connection reset by peer")
            return super().read(size if size is not None and size >= 0 else 4096)

    class FlakyFs:
        def open(self, url: str, mode: str) -> Flaky:
            return Flaky(data)

    fs: Any = FlakyFs()
    with pytest.raises(CorpusError, match="storage refused") as caught:
        count_rows(fs, "c.jsonl.gz", FileFormat("jsonl", "gzip"), "c.jsonl.gz", "reject")
    assert not isinstance(caught.value, CorpusMismatch)


def test_corrupt_parquet_and_json_structure_in_reject_mode(kit: Any, tmp_path: Path) -> None:
    (tmp_path / "a.parquet").write_bytes(b"not parquet")
    (tmp_path / "b.json").write_bytes(b'[{"id": "b0", "text": "ok"}, {"id": "b1", "text": "never closed')
    options = CorpusOptions(str(tmp_path), id_field="id", on_bad_file="reject")
    items = kit.read_all(options)
    assert [(item.id, getattr(item, "reason", "ok")) for item in items] == [
        ("a.parquet#0", "malformed_record"), ("b0", "ok"), ("b.json#1", "malformed_record")]
    assert "Parquet" in items[0].detail and "inside a string" in items[2].detail


def test_corrupt_compressed_text_file(kit: Any, tmp_path: Path) -> None:
    (tmp_path / "a.txt").write_text("fine")
    (tmp_path / "b.txt.gz").write_bytes(_compressed(".gz", b"words " * 1000)[:50])
    with pytest.raises(CorpusMismatch, match=r"b\.txt\.gz"):
        kit.read_all(CorpusOptions(str(tmp_path)))
    items = kit.read_all(CorpusOptions(str(tmp_path), on_bad_file="reject"))
    assert [(item.id, getattr(item, "reason", "ok")) for item in items] == [
        ("a.txt", "ok"), ("b.txt.gz", "malformed_record")]
