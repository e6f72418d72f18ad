"""Kill the driver (SIGKILL) early, in the middle, during a commit; kill a worker; resume.

Each time the final output must equal an uninterrupted run's, row for row, with no duplicate
and no temporary file left.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import ray
import yaml

from teibatch.crashpoints import CRASH_AT, CRASH_ONCE
from tests.conftest import write_jsonl

RUN_TIMEOUT_S = 120


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("crash") / "corpus"
    for f in range(6):
        write_jsonl(root / f"f{f}.jsonl", [{"id": f"{f}-{i}", "text": f"text {i} of file {f}", "n": str(i)}
                                          for i in range(20)])
    (root / "f6.jsonl").write_text('{"id": "bad", "text": ""}\n{"id": "good", "text": "fine"}\n')
    return root


@pytest.fixture(scope="module")
def ray_address(ray_session: None) -> Iterator[str]:
    yield ray.get_runtime_context().gcs_address


def write_job(tmp_path: Path, corpus: Path, out: Path, **sections: object) -> Path:
    spec = {"name": "crash", "corpus": {"path": str(corpus), "id_field": "id", "keep_fields": ["n"],
                                        "shard_docs": 10},
            "servers": {"provider": "local", "count": 2}, "output": {"path": str(out)},
            "limits": {"max_shards_in_flight": 2}, **sections}
    path = tmp_path / f"{out.name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def run(job: Path, address: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "teibatch", "run", str(job), "-q", "--ray-address", address],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)


def output_rows(out: Path) -> tuple[pa.Table, pa.Table]:
    vectors = ds.dataset(out / "vectors").to_table().sort_by("id")
    rejects = ds.dataset(out / "rejects").to_table().sort_by("id")
    return vectors, rejects


@pytest.fixture(scope="module")
def baseline(corpus: Path, ray_address: str, tmp_path_factory: pytest.TempPathFactory) -> tuple[pa.Table, pa.Table]:
    tmp = tmp_path_factory.mktemp("baseline")
    done = run(write_job(tmp, corpus, tmp / "out"), ray_address)
    assert done.returncode == 0, done.stderr
    return output_rows(tmp / "out")


@pytest.mark.parametrize(("point", "driver_dies"), [
    pytest.param("plan:1", True, id="driver-early-after-plan"),
    pytest.param("commit:4", True, id="driver-middle-after-4-commits"),
    pytest.param("manifest-write:3", True, id="driver-during-a-manifest-write"),
    pytest.param("shard-write:1", False, id="worker-between-its-two-parts"),
])
def test_killed_run_resumes_to_the_same_output(point: str, driver_dies: bool, corpus: Path, ray_address: str,
                                               baseline: tuple[pa.Table, pa.Table], tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = write_job(tmp_path, corpus, out)
    crashed = run(job, ray_address, {CRASH_AT: point, CRASH_ONCE: str(tmp_path / "crashed-once")})
    assert (tmp_path / "crashed-once").exists(), "the crash point was reached"
    if driver_dies:
        assert crashed.returncode == -signal.SIGKILL
        held = orjson.loads((out / "_lock.json").read_bytes())  # a killed run cannot release the output
        assert held["pid"] != os.getpid() and held["run_id"]
        resumed = run(job, ray_address)  # its process is gone: the same command takes the lock over
        assert resumed.returncode == 0, resumed.stderr
        assert not (out / "_lock.json").exists()
    else:
        assert crashed.returncode == 0, crashed.stderr  # Ray retried the task on a new worker
    vectors, rejects = output_rows(out)
    assert vectors.equals(baseline[0])
    assert rejects.equals(baseline[1])
    leftovers = [p for p in out.rglob("*") if p.name.startswith(".tmp-")]
    assert leftovers == []


def assert_ids_unique(table: pa.Table) -> None:
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids))


def test_baseline_is_complete(baseline: tuple[pa.Table, pa.Table]) -> None:
    vectors, rejects = baseline
    assert vectors.num_rows == 121
    assert_ids_unique(vectors)
    assert rejects.column("id").to_pylist() == ["bad"]




def crash_and_resume(job: Path, address: str, point: str, driver_dies: bool, tmp_path: Path) -> None:
    """Run ``job`` killed once at ``point``; when the driver died, run it again to the end."""
    crashed = run(job, address, {CRASH_AT: point, CRASH_ONCE: str(tmp_path / "crashed-once")})
    assert (tmp_path / "crashed-once").exists(), "the crash point was reached"
    if driver_dies:
        assert crashed.returncode == -signal.SIGKILL
        resumed = run(job, address)
        assert resumed.returncode == 0, resumed.stderr
    else:
        assert crashed.returncode == 0, crashed.stderr  # Ray ran the task again on a new worker


CHUNKING = {"strategy": "tokens", "max_tokens": 5, "overlap_tokens": 1, "document_vector": "mean"}


@pytest.mark.parametrize(("point", "driver_dies"), [
    pytest.param("commit:3", True, id="driver-middle-after-3-commits"),
    pytest.param("shard-write:2", False, id="worker-between-its-parts"),
])
def test_killed_chunked_run_resumes_to_the_same_output(point: str, driver_dies: bool, corpus: Path, ray_address: str,
                                                       tmp_path: Path) -> None:
    fresh = tmp_path / "fresh"
    assert run(write_job(tmp_path, corpus, fresh, chunking=CHUNKING), ray_address).returncode == 0
    out = tmp_path / "out"
    crash_and_resume(write_job(tmp_path, corpus, out, chunking=CHUNKING), ray_address, point, driver_dies, tmp_path)
    vectors, rejects = output_rows(out)
    expected_vectors, expected_rejects = output_rows(fresh)
    assert vectors.num_rows > 121  # chunks, more than the documents
    assert_ids_unique(vectors)
    assert vectors.equals(expected_vectors)
    assert rejects.equals(expected_rejects)
    documents = ds.dataset(out / "documents").to_table().sort_by("id")
    assert documents.equals(ds.dataset(fresh / "documents").to_table().sort_by("id"))
    assert documents.num_rows == 121
    assert [p for p in out.rglob("*") if p.name.startswith(".tmp-")] == []


def status(out: Path) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "teibatch", "status", str(out), "--json"], capture_output=True,
                          text=True, timeout=RUN_TIMEOUT_S, check=False)
    assert done.returncode == 0, done.stderr
    state: dict[str, Any] = orjson.loads(done.stdout)
    return state


def test_a_deleted_part_is_found_by_status_and_embedded_again(corpus: Path, ray_address: str,
                                                               baseline: tuple[pa.Table, pa.Table],
                                                               tmp_path: Path) -> None:
    out = tmp_path / "out"
    job = write_job(tmp_path, corpus, out)
    assert run(job, ray_address).returncode == 0
    gone = sorted((out / "vectors").glob("part-*.parquet"))[0]
    rows = pq.read_metadata(gone).num_rows
    gone.unlink()
    state = status(out)
    assert state["documents"]["vectors"] == 121 - rows  # the rows that exist, not the manifest's count
    assert state["parts"] == {"missing": [gone.name], "wrong_size": []}
    again = run(job, ray_address)
    assert again.returncode == 0, again.stderr
    vectors, rejects = output_rows(out)
    assert vectors.equals(baseline[0])
    assert rejects.equals(baseline[1])
    report = max((out / "runs").glob("*.json"), key=lambda p: p.stat().st_mtime)
    assert orjson.loads(report.read_bytes())["parts_missing"] == [gone.name]
    assert status(out)["parts"] == {"missing": [], "wrong_size": []}


def test_status_after_a_killed_run_names_no_writer(corpus: Path, ray_address: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    crashed = run(write_job(tmp_path, corpus, out), ray_address, {CRASH_AT: "commit:2"})
    assert crashed.returncode == -signal.SIGKILL
    held = orjson.loads((out / "_lock.json").read_bytes())
    state = status(out)
    assert state["writing"] is None
    assert state["stale_lock"]["pid"] == held["pid"]
    table = subprocess.run([sys.executable, "-m", "teibatch", "status", str(out)], capture_output=True, text=True,
                           timeout=RUN_TIMEOUT_S, check=False)
    assert "writing now" not in table.stdout and "is gone" in table.stdout


def globbed_ids(out: Path) -> list[str]:
    """The ids a reader of ``vectors/*.parquet`` sees (DuckDB's and Polars' way), one file after another."""
    return [i for path in sorted((out / "vectors").glob("*.parquet"))
            for i in pq.read_table(path, columns=["id"]).column("id").to_pylist()]


@pytest.mark.parametrize("point", [
    pytest.param("commit:1", id="after-the-first-new-shard-committed"),
    pytest.param("replace:1", id="after-the-old-parts-went-before-the-new-came"),
])
@pytest.mark.parametrize("mode", ["incremental", "full"])
def test_an_edited_file_never_shows_an_id_twice(point: str, mode: str, ray_address: str, tmp_path: Path) -> None:
    root = tmp_path / "corpus"
    rows = {f: [{"id": f"{f}-{i}", "text": f"text {i} of file {f}", "n": str(i)} for i in range(20)] for f in range(2)}
    for f, file_rows in rows.items():
        write_jsonl(root / f"f{f}.jsonl", file_rows)
    out = tmp_path / "out"
    job = write_job(tmp_path, root, out, mode=mode)
    assert run(job, ray_address).returncode == 0
    before = sorted(globbed_ids(out))
    rows[0][3]["text"] = "an edited text"  # one document edited, one deleted: both of f0's shards change
    del rows[0][15]
    write_jsonl(root / "f0.jsonl", rows[0])
    crashed = run(job, ray_address, {CRASH_AT: point})
    assert crashed.returncode == -signal.SIGKILL
    for ids in (globbed_ids(out), ds.dataset(out / "vectors").to_table().column("id").to_pylist()):
        assert len(ids) == len(set(ids))  # every id at most once while the run is not finished...
        assert set(ids) <= set(before)  # ...and no row of the new f0 yet: its group is not all committed
    resumed = run(job, ray_address)
    assert resumed.returncode == 0, resumed.stderr
    after = globbed_ids(out)
    assert sorted(after) == sorted(r["id"] for file_rows in rows.values() for r in file_rows)
    assert sorted(ds.dataset(out / "vectors").to_table().column("id").to_pylist()) == sorted(after)
    assert [p.name for p in out.rglob(".*") if p.is_file()] == []  # no staged or temporary file left
