"""An output whose disk fills up: the run says so with the room it needs, and resumes once there is room."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import jsonschema
import orjson
import pyarrow.dataset as ds
import pytest
import yaml
from click.testing import CliRunner, Result

from teibatch.cli import main
from teibatch.corpus import Shard
from teibatch.errors import StorageFull
from teibatch.job import JobSpec
from teibatch.pipeline.storage_full import with_estimate
from teibatch.sink import LOCK, MANIFEST, Manifest, OutputStore
from tests.conftest import write_jsonl

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.timeout(300)]

DOCS = Path(__file__).resolve().parents[2] / "docs"
DOCUMENTS = 4000
SHARD_DOCS = 500  # uncompressed 384-float vectors: about 0.8 MB a part, so three of eight fit in 3 MB


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 3 MB tmpfs mounted for the test (skipped where mounting is not allowed); unmounted after."""
    mount_point = tmp_path / "disk"
    mount_point.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3M", "tmpfs", str(mount_point)],
                             capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here (needs root, or mount is not allowed): {mounted.stderr.strip()}")
    try:
        yield mount_point
    finally:
        if subprocess.run(["umount", str(mount_point)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(mount_point)], check=False)


def run(job: Path) -> Result:
    return CliRunner().invoke(main, ["run", str(job), "-q"])


def test_a_full_output_says_how_much_room_it_needs_and_resumes_once_there_is_room(
        tmp_path: Path, small_disk: Path) -> None:
    ids = [f"doc-{i:05d}" for i in range(DOCUMENTS)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl",
                [{"id": doc_id, "text": f"document {i} about {i % 97} and {i * 7919 % 10007}"}
                 for i, doc_id in enumerate(ids)])
    out = small_disk / "out"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": SHARD_DOCS},
        "servers": {"provider": "local", "count": 1},
        "output": {"path": str(out), "compression": "none"},
    }))

    full = run(job)
    assert full.exit_code == 1, full.output
    message = full.stderr
    assert f"the output's storage is full: {out} needs about " in message, message
    assert "an estimate:" in message and "per document, the mean of the" in message, message
    assert "No space left on device" in message
    assert "run the same command again: it resumes" in message
    # Nothing the full disk cut short is left behind: the manifest is whole, no lock, no temporary file.
    manifest = orjson.loads((out / MANIFEST).read_bytes())
    committed = set(manifest["shards"])
    assert 0 < len(committed) < DOCUMENTS // SHARD_DOCS
    assert not (out / LOCK).exists()
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp-")]
    (report_path,) = (out / "runs").iterdir()
    report = orjson.loads(report_path.read_bytes())
    assert report["status"] == "incomplete"
    jsonschema.validate(report, orjson.loads((DOCS / "json" / "run-report.schema.json").read_bytes()))
    assert report["storage_full"]["path"] == str(out) and not report["storage_full"]["temporary"]
    needed = report["storage_full"]["needed_bytes"]
    assert f"{needed / 1e6:.1f} MB" in message
    assert report["errors"][0] == message.removeprefix("error: ").strip()

    subprocess.run(["mount", "-o", "remount,size=64M", str(small_disk)], check=True)
    resumed = run(job)
    assert resumed.exit_code == 0, resumed.output
    vectors = ds.dataset(out / "vectors").to_table()
    assert sorted(vectors.column("id").to_pylist()) == ids  # every document exactly once
    assert ds.dataset(out / "rejects").to_table().num_rows == 0
    manifest = orjson.loads((out / MANIFEST).read_bytes())
    assert len(manifest["shards"]) == DOCUMENTS // SHARD_DOCS and committed <= set(manifest["shards"])
    # The estimate was the room the rest took, near enough to act on.
    written = sum(p.stat().st_size for d in ("vectors", "rejects") for p in (out / d).iterdir()
                  if p.stem.removeprefix("part-") not in committed)
    assert 0.8 * written <= needed <= 1.25 * written, (needed, written)


def output_with(tmp_path: Path, *, committed: dict[str, int], planned: list[str], part_bytes: int = 0,
                dimension: int | None = None) -> OutputStore:
    """An output whose manifest commits ``committed`` (shard → documents), each part ``part_bytes`` long."""
    store = OutputStore(str(tmp_path / "out"))
    manifest = Manifest(fingerprint="f", job_name="j", planned=planned,
                        info={"dimension": dimension} if dimension else {})
    for shard_id, documents in committed.items():
        manifest.commit(shard_id, rows=documents - 1, rejects=1, run_id="r1")
        store.write_atomic(f"vectors/part-{shard_id}.parquet", lambda handle: handle.write(b"v" * (part_bytes - 10)))
        store.write_atomic(f"rejects/part-{shard_id}.parquet", lambda handle: handle.write(b"r" * 10))
    manifest.save(store)
    return store


def estimate(store: OutputStore, *, shards: list[Shard] | None = None, temporary: bool = False,
             vector_type: str = "float32") -> StorageFull:
    job = JobSpec.model_validate({"corpus": {"path": "c", "shard_docs": 1000}, "output": {
        "path": store.url, "vector_type": vector_type}})
    found = StorageFull("no room left to write it: [Errno 28] No space left on device", path=store.url,
                        temporary=temporary)
    return with_estimate(found, job, store, Manifest.load(store), shards)


def test_the_estimate_is_the_committed_parts_mean_times_the_documents_left(tmp_path: Path) -> None:
    store = output_with(tmp_path, committed={"a": 100, "b": 100}, planned=["a", "b", "c", "d"], part_bytes=1000)
    pending = [Shard("c", ("x.jsonl",), 200, 450, "jsonl"), Shard("d", ("x.jsonl",), 450, 500, "jsonl")]
    full = estimate(store, shards=[Shard("a", ("x.jsonl",), 0, 100, "jsonl"), *pending])
    assert full.needed_bytes == 300 * 10  # 2,000 bytes over 200 documents; 300 documents to write
    assert "needs about 3.0 kB more (an estimate: 300 documents × 10 bytes per document" in str(full)
    # Before the corpus is planned (the probe found the disk full): the latest plan's pending shards.
    assert estimate(store).needed_bytes == 2 * 100 * 10


def test_before_any_part_the_vectors_alone_or_nothing(tmp_path: Path) -> None:
    shards = [Shard("a", ("x.jsonl",), 0, 1000, "jsonl")]
    store = output_with(tmp_path / "known", committed={}, planned=["a"], dimension=384)
    full = estimate(store, shards=shards, vector_type="float16")
    assert full.needed_bytes == 1000 * 384 * 2
    assert "the vectors alone: 384 dimensions × 2 bytes" in str(full)
    unknown = estimate(output_with(tmp_path / "unknown", committed={}, planned=["a"]), shards=shards)
    assert unknown.needed_bytes is None and "cannot be estimated" in str(unknown)


def test_a_full_temporary_directory_needs_room_for_a_part_per_running_shard(tmp_path: Path) -> None:
    store = output_with(tmp_path, committed={"a": 100}, planned=["a", "b"], part_bytes=1000)
    full = estimate(store, temporary=True)
    assert full.temporary and full.needed_bytes == 1000 * 10  # shard_docs × 10 bytes per document
    assert "temporary directory" in str(full) and "TMPDIR" in str(full)
