from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from teibatch.errors import StorageFull
from teibatch.quantize import Quantization
from teibatch.sink import (
    Manifest,
    OutputStore,
    VectorSchema,
    VectorsPart,
    WriteOptions,
    part_metadata,
    read_vectors,
    rejects_table,
    remove_stale,
    vectors_table,
    write_part,
)
from teibatch.sink.parts import METADATA_KEY
from teibatch.sparse import SparseVector, sparse_rows


@pytest.mark.parametrize("vector_type", [pytest.param("float32", id="f32"), pytest.param("float16", id="f16")])
def test_vectors_part_schema_and_values(tmp_path: Path, vector_type: str) -> None:
    schema = VectorSchema(dimension=4, vector_type=vector_type, kept={"title": pa.string()},
                          metadata={"model_id": "m"})
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4) / 10
    table = vectors_table(schema, ["a", "b", "c"], vectors, ["h1", "h2", "h3"], {"title": ["x", None, "z"]})
    store = OutputStore(str(tmp_path))
    relative = write_part(store, "vectors", "s1", table, WriteOptions())
    read = pq.read_table(tmp_path / relative)
    expected_type = pa.float16() if vector_type == "float16" else pa.float32()
    assert read.schema.field("embedding").type == pa.list_(pa.field("item", expected_type, nullable=False), 4)
    assert read.column("id").to_pylist() == ["a", "b", "c"]
    assert read.column("title").to_pylist() == ["x", None, "z"]
    got = np.array(read.column("embedding").to_pylist(), dtype=np.float32)
    np.testing.assert_allclose(got, vectors, rtol=1e-3)
    meta = orjson.loads(read.schema.metadata[METADATA_KEY])
    assert meta == {"model_id": "m", "dimension": 4, "vector_type": vector_type}


def test_sparse_part_round_trips_through_read_vectors_and_names_its_kept_fields(tmp_path: Path) -> None:
    schema = VectorSchema(dimension=30522, kept={"title": pa.string()}, metadata={"model_id": "m"}, sparse=True)
    rows = [SparseVector(np.array([3, 17, 30521], dtype=np.int32), np.array([0.5, 1.5, 2.5], dtype=np.float32)),
            SparseVector(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)),
            SparseVector(np.array([0], dtype=np.int32), np.array([7.0], dtype=np.float32))]
    vectors = sparse_rows(3)
    vectors[:] = rows
    table = vectors_table(schema, ["a", "b", "c"], vectors, ["h1", "h2", "h3"], {"title": ["x", None, "z"]},
                          truncated=[False, True, False])
    store = OutputStore(str(tmp_path))
    relative = write_part(store, "vectors", "s1", table, WriteOptions())
    read = pq.read_table(tmp_path / relative)
    assert read.schema.names == ["id", "indices", "values", "content_hash", "truncated", "title"]
    assert read.column("indices").to_pylist() == [[3, 17, 30521], [], [0]]
    assert read.column("values").to_pylist() == [[0.5, 1.5, 2.5], [], [7.0]]
    meta = orjson.loads(read.schema.metadata[METADATA_KEY])
    assert meta == {"model_id": "m", "kind": "sparse", "vocab_size": 30522, "vector_type": "float32"}
    found = read_vectors(store, [relative], {"a", "b", "c"}, schema)
    assert found == {"a": ("h1", rows[0], False), "b": ("h2", rows[1], True), "c": ("h3", rows[2], False)}
    assert part_metadata(store, relative) == (meta, ("title",))


def test_unique_columns_are_written_plainly_and_kept_fields_with_dictionaries(tmp_path: Path) -> None:
    # Dictionaries on all-different values and min/max of vector coordinates only cost write time.
    schema = VectorSchema(dimension=4, kept={"lang": pa.string()})
    vectors = np.ones((50, 4), dtype=np.float32)
    table = vectors_table(schema, [f"id-{i}" for i in range(50)], vectors, [f"h{i}" for i in range(50)],
                          {"lang": ["en"] * 50})
    relative = write_part(OutputStore(str(tmp_path)), "vectors", "s1", table, WriteOptions())
    group = pq.ParquetFile(tmp_path / relative).metadata.row_group(0)
    columns = {group.column(i).path_in_schema.split(".")[0]: group.column(i) for i in range(group.num_columns)}
    for name in ("id", "embedding", "content_hash"):
        assert not any("DICTIONARY" in encoding for encoding in columns[name].encodings), name
    assert any("DICTIONARY" in encoding for encoding in columns["lang"].encodings)
    assert not columns["embedding"].is_stats_set
    assert columns["id"].is_stats_set and columns["id"].statistics.min == "id-0"


def test_parts_round_trip_non_ascii_empty_and_truncated_rows(tmp_path: Path) -> None:
    schema = VectorSchema(dimension=2)
    ids = ["é-1", "", "日本-3", "x" * 300]
    flags = np.array([True, False, False, True])
    table = vectors_table(schema, ids, np.ones((4, 2), dtype=np.float32), ["h"] * 4, {}, truncated=flags)
    relative = write_part(OutputStore(str(tmp_path)), "vectors", "s1", table, WriteOptions())
    read = pq.read_table(tmp_path / relative)
    assert read.column("id").to_pylist() == ids
    assert read.column("truncated").to_pylist() == flags.tolist()
    empty = vectors_table(schema, [], np.zeros((0, 2), dtype=np.float32), [], {})
    assert empty.num_rows == 0 and empty.schema == schema.arrow()
    rejects = rejects_table(["a", "ü"], ["too_long", "empty"], ["", "détail"])
    assert rejects.to_pylist()[1] == {"id": "ü", "reason": "empty", "detail": "détail"}


def test_parts_without_kept_fields_do_not_import_pandas(tmp_path: Path) -> None:
    # pyarrow imports pandas on a process's first pa.array (0.3-0.5 s of CPU in each shard worker).
    script = textwrap.dedent(f"""
        import sys
        import numpy as np
        from teibatch.sink import OutputStore, VectorSchema, WriteOptions, rejects_table, vectors_table, write_part
        store = OutputStore({str(tmp_path)!r})
        table = vectors_table(VectorSchema(dimension=3), ["a", "b"], np.ones((2, 3), dtype=np.float32),
                              ["h1", "h2"], {{}}, truncated=np.array([False, True]))
        write_part(store, "vectors", "s1", table, WriteOptions())
        write_part(store, "rejects", "s1", rejects_table(["c"], ["empty"], ["no text"]), WriteOptions())
        print("pandas" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stdout.strip() == "False"
    assert pq.read_table(tmp_path / "vectors" / "part-s1.parquet").column("truncated").to_pylist() == [False, True]


def test_manifest_roundtrip_and_stale_removal(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path))
    manifest = Manifest(fingerprint="f", job_name="j", planned=["keep", "gone", "todo"])
    schema = VectorSchema(dimension=2)
    for shard in ("keep", "gone"):
        table = vectors_table(schema, [shard], np.ones((1, 2), np.float32), ["h"], {})
        write_part(store, "vectors", shard, table, WriteOptions())
        manifest.commit(shard, rows=1, rejects=0, run_id="r1")
    (tmp_path / "vectors" / ".tmp-abc-part-x.parquet").write_bytes(b"junk")
    manifest.save(store)
    loaded = Manifest.load(store)
    assert loaded is not None
    assert set(loaded.shards) == {"keep", "gone"}
    assert loaded.rows == 2
    assert loaded.pending == ["todo"]
    assert remove_stale(store, loaded, {"keep"}) == ["gone"]
    assert sorted(p.name for p in (tmp_path / "vectors").iterdir()) == ["part-keep.parquet"]


def test_a_part_built_in_pieces_is_the_part_written_whole(tmp_path: Path) -> None:
    schema = VectorSchema(dimension=3, kept={"lang": pa.string()}, metadata={"model_id": "m"})
    rows = 23
    ids = [f"id-{i}" for i in range(rows)]
    vectors = np.arange(rows * 3, dtype=np.float32).reshape(rows, 3)
    hashes = [f"h{i}" for i in range(rows)]
    langs = ["en" if i % 3 else "de" for i in range(rows)]
    flags = np.arange(rows) % 5 == 0
    options = WriteOptions(row_group_size=8)
    store = OutputStore(str(tmp_path / "out"))
    whole = write_part(OutputStore(str(tmp_path / "whole")), "vectors", "s1",
                       vectors_table(schema, ids, vectors, hashes, {"lang": langs}, flags), options)
    with VectorsPart(schema, options) as part:
        for start, end in ((0, 3), (3, 3), (3, 11), (11, 20), (20, 23)):
            part.add(vectors_table(schema, ids[start:end], vectors[start:end], hashes[start:end],
                                   {"lang": langs[start:end]}, flags[start:end]))
            assert part.rows == end
            assert part.encoded_rows == end - end % 8  # full groups are encoded as soon as their rows are in
        assert not (tmp_path / "out").exists()  # nothing reaches the output before the commit
        relative = part.commit(store, "vectors", "s1")
    assert relative == whole == "vectors/part-s1.parquet"
    built, expected = pq.ParquetFile(tmp_path / "out" / relative), pq.ParquetFile(tmp_path / "whole" / whole)
    assert built.read().equals(expected.read())
    assert built.schema_arrow.metadata == expected.schema_arrow.metadata
    groups = [built.metadata.row_group(i).num_rows for i in range(built.metadata.num_row_groups)]
    assert groups == [8, 8, 7]
    assert [name for name in (tmp_path / "out" / "vectors").iterdir()] == [tmp_path / "out" / relative]


def test_an_empty_part_and_a_forgotten_one(tmp_path: Path) -> None:
    schema = VectorSchema(dimension=2)
    store = OutputStore(str(tmp_path))
    with VectorsPart(schema, WriteOptions()) as part:
        relative = part.commit(store, "vectors", "empty")
    read = pq.read_table(tmp_path / relative)
    assert read.num_rows == 0
    assert read.schema.names == schema.arrow().names and read.schema.metadata == schema.arrow().metadata
    with VectorsPart(schema, WriteOptions(row_group_size=2)) as part:
        part.add(vectors_table(schema, ["a", "b", "c"], np.ones((3, 2), np.float32), ["h"] * 3, {}))
        spill = part._spill
    assert spill.closed  # leaving without a commit drops the encoded groups
    assert sorted(p.name for p in (tmp_path / "vectors").iterdir()) == ["part-empty.parquet"]


def test_a_full_temporary_directory_is_storage_full_naming_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # /dev/full refuses every write with ENOSPC, as a full TMPDIR does.
    monkeypatch.setattr(tempfile, "TemporaryFile", lambda **_: open("/dev/full", "w+b", buffering=0))  # noqa: SIM115
    schema = VectorSchema(dimension=2)
    with pytest.raises(StorageFull) as caught, VectorsPart(schema, WriteOptions(row_group_size=2)) as part:
        part.add(vectors_table(schema, ["a", "b", "c"], np.ones((3, 2), np.float32), ["h"] * 3, {}))
        part.commit(OutputStore(str(tmp_path)), "vectors", "s1")
    assert caught.value.temporary and caught.value.path == tempfile.gettempdir()
    assert caught.value.exit_code == 1
    assert not (tmp_path / "vectors").exists()  # nothing reached the output


@pytest.mark.parametrize(("vector_type", "value_type", "width"), [
    pytest.param("int8", pa.int8(), 10, id="int8"), pytest.param("uint8", pa.uint8(), 10, id="uint8"),
    pytest.param("binary", pa.uint8(), 2, id="binary")])
def test_quantized_part_stores_codes_and_keeps_the_float_vector(tmp_path: Path, vector_type: str,
                                                                value_type: pa.DataType, width: int) -> None:
    vectors = np.random.default_rng(3).normal(size=(6, 10)).astype(np.float32)
    quantization = Quantization.calibrate(vector_type, vectors)
    schema = VectorSchema(dimension=10, vector_type=vector_type, quantization=quantization, keep_float=True,
                          kept={"title": pa.string()})
    table = vectors_table(schema, [f"d{i}" for i in range(6)], vectors, ["h"] * 6, {"title": ["t"] * 6})
    store = OutputStore(str(tmp_path))
    relative = write_part(store, "vectors", "s1", table, WriteOptions())
    read = pq.read_table(tmp_path / relative)
    assert read.schema.names[:3] == ["id", "embedding", "embedding_float"]
    assert read.schema.field("embedding").type == pa.list_(pa.field("item", value_type, nullable=False), width)
    stored = np.array(read.column("embedding").to_pylist(), dtype=quantization.dtype)
    np.testing.assert_array_equal(stored, quantization.quantize(vectors))
    np.testing.assert_array_equal(np.array(read.column("embedding_float").to_pylist(), dtype=np.float32), vectors)
    meta = orjson.loads(read.schema.metadata[METADATA_KEY])
    assert meta["quantization"] == quantization.to_json() and meta["keep_float"] is True
    found = part_metadata(store, relative)
    assert found is not None and found[1] == ("title",)  # the float column is no kept field
    reused = read_vectors(store, [relative], {"d1", "d4"}, schema)
    np.testing.assert_array_equal(reused["d4"][1], vectors[4])  # the float column: exact
    group = pq.ParquetFile(tmp_path / relative).metadata.row_group(0)
    encodings = {group.column(i).path_in_schema.split(".")[0]: group.column(i).encodings
                 for i in range(group.num_columns)}
    assert any("DICTIONARY" in e for e in encodings["embedding"])  # 8-bit values: a byte each, not four
    assert not any("DICTIONARY" in e for e in encodings["embedding_float"])


@pytest.mark.parametrize("vector_type", ["int8", "uint8", "binary"])
def test_reused_quantized_vectors_write_the_same_codes_again(tmp_path: Path, vector_type: str) -> None:
    # Without the float column, a reused row's vector is its codes' middle value: written again, the same codes.
    vectors = np.random.default_rng(4).normal(size=(8, 12)).astype(np.float32)
    schema = VectorSchema(dimension=12, vector_type=vector_type,
                          quantization=Quantization.calibrate(vector_type, vectors))
    store = OutputStore(str(tmp_path))
    first = vectors_table(schema, [f"d{i}" for i in range(8)], vectors, ["h"] * 8, {})
    relative = write_part(store, "vectors", "s1", first, WriteOptions())
    reused = read_vectors(store, [relative], {f"d{i}" for i in range(8)}, schema)
    assert set(reused) == {f"d{i}" for i in range(8)}
    again = vectors_table(schema, list(reused), np.stack([v for _, v, _ in reused.values()]), ["h"] * 8, {})
    assert again.column("embedding").to_pylist() == first.column("embedding").to_pylist()
