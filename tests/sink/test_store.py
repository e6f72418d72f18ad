from __future__ import annotations

from pathlib import Path

import pytest

from teibatch.errors import SinkError
from teibatch.sink import OutputStore


def test_write_atomic_leaves_no_temp_on_failure(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path / "out"))

    def explode(handle: object) -> None:
        handle.write(b"half")  # type: ignore[attr-defined]
        raise OSError("disk full")

    with pytest.raises(SinkError, match="disk full"):
        store.write_atomic("vectors/part-x.parquet", explode)
    assert list((tmp_path / "out" / "vectors").iterdir()) == []


def test_write_and_read_json_roundtrip(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path))
    store.write_json("a/b.json", {"z": 1, "a": [1, 2]})
    assert store.read_json("a/b.json") == {"z": 1, "a": [1, 2]}
    assert store.read_json("a/missing.json") is None
    assert store.list("a") == ["b.json"]
    assert store.list("nothing-here") == []


def test_damaged_json_is_a_sink_error(tmp_path: Path) -> None:
    (tmp_path / "_manifest.json").write_text("{not json")
    with pytest.raises(SinkError, match="not valid JSON"):
        OutputStore(str(tmp_path)).read_json("_manifest.json")


@pytest.mark.parametrize("size", [pytest.param(100, id="one-put"), pytest.param(12 * 2**20, id="multipart")])
def test_a_failed_write_to_object_storage_leaves_no_object(s3_endpoint: str, size: int) -> None:
    boto3 = pytest.importorskip("boto3")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="out")
    store = OutputStore("s3://out/run", {"key": "testing", "secret": "testing",
                                         "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}})

    def explode(handle: object) -> None:
        handle.write(b"x" * size)  # type: ignore[attr-defined]
        raise OSError("the encoder failed")

    with pytest.raises(SinkError, match="the encoder failed"):
        store.write_atomic("vectors/part-x.parquet", explode)
    store.fs.invalidate_cache()
    assert not store.fs.exists("out/run/vectors/part-x.parquet")
    assert not boto3.client("s3", endpoint_url=s3_endpoint).list_multipart_uploads(Bucket="out").get("Uploads")
    store.write_atomic("vectors/part-x.parquet", lambda handle: handle.write(b"whole"))
    assert store.fs.cat("out/run/vectors/part-x.parquet") == b"whole"
