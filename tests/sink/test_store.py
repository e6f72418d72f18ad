from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from teibatch.errors import SinkError, StorageFull
from teibatch.sink import LOCK, MANIFEST, Manifest, OutputLock, OutputStore, write_report
from tests.sink.conftest import FullDisk


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


def test_a_full_disk_is_storage_full_and_the_old_manifest_stays_whole(
        tmp_path: Path, full_disk: Callable[[OutputStore, int], FullDisk]) -> None:
    store = OutputStore(str(tmp_path / "out"))
    manifest = Manifest(fingerprint="f", job_name="j", planned=["a", "b"], options={"model.normalize": True})
    manifest.commit("a", rows=3, rejects=0, run_id="r1")
    manifest.save(store)
    before = (tmp_path / "out" / MANIFEST).read_bytes()
    full_disk(store, 100)  # the new manifest breaks off half-way
    manifest.commit("b", rows=4, rejects=1, run_id="r1")
    with pytest.raises(StorageFull) as caught:
        manifest.save(store)
    assert caught.value.exit_code == 1 and caught.value.path == store.url
    assert "no room left to write" in str(caught.value) and "No space left on device" in str(caught.value)
    assert (tmp_path / "out" / MANIFEST).read_bytes() == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [MANIFEST]  # no temp file left
    loaded = Manifest.load(store)
    assert loaded is not None and set(loaded.shards) == {"a"}


def test_a_lock_that_does_not_fit_is_not_left_behind(tmp_path: Path,
                                                     full_disk: Callable[[OutputStore, int], FullDisk]) -> None:
    store = OutputStore(str(tmp_path / "out"))
    disk = full_disk(store, 20)
    with pytest.raises(StorageFull):
        OutputLock(store, "r1").acquire()
    assert not (tmp_path / "out" / LOCK).exists()  # a half-written lock would refuse every later run
    with pytest.raises(StorageFull, match="probe"):
        store.check_writable()  # not OutputUnwritable: exit 1, not 2
    assert list((tmp_path / "out").iterdir()) == []
    disk.room = 1 << 20  # room again: the next run takes the output
    lock = OutputLock(store, "r2")
    lock.acquire()
    lock.release()


def test_a_report_that_does_not_fit_is_storage_full(tmp_path: Path,
                                                    full_disk: Callable[[OutputStore, int], FullDisk]) -> None:
    store = OutputStore(str(tmp_path / "out"))
    full_disk(store, 0)
    with pytest.raises(StorageFull):
        write_report(store, "r1", {"status": "done"})
    assert not (tmp_path / "out" / "runs").exists() or list((tmp_path / "out" / "runs").iterdir()) == []


def test_other_write_failures_stay_sink_errors(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path / "out"))

    def refuse(handle: object) -> None:
        raise PermissionError(13, "Permission denied")

    with pytest.raises(SinkError) as caught:
        store.write_atomic("x.json", refuse)
    assert not isinstance(caught.value, StorageFull)


def test_a_json_object_replaced_while_it_is_read_is_read_again(s3_endpoint: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # A run's lock heartbeat rewrites _lock.json while the run itself reads it: s3fs opens the object
    # (its ETag), the heartbeat replaces it, and the read of the opened object fails (EBUSY).
    boto3 = pytest.importorskip("boto3")
    boto3.client("s3", endpoint_url=s3_endpoint).create_bucket(Bucket="out")
    options = {"key": "testing", "secret": "testing", "skip_instance_cache": True,
               "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    store, writer = OutputStore("s3://out/run", options), OutputStore("s3://out/run", options)
    store.write_json(LOCK, {"beat": 1})
    real_open = store.fs.open
    replaced: list[int] = []

    def open_then_replace(path: str, mode: str = "rb", **kwargs: object) -> object:
        handle = real_open(path, mode, **kwargs)
        if not replaced:  # the first opening only: the object changes under it
            writer.write_json(LOCK, {"beat": 2})
            replaced.append(1)
        return handle

    monkeypatch.setattr(store.fs, "open", open_then_replace)
    assert store.read_json(LOCK, fresh=True) == {"beat": 2}
    assert replaced == [1]
