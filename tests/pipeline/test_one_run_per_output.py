"""Two runs of one job on one output, started together: one works, the other is refused and touches nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import pytest
import ray
import yaml

from teibatch.errors import EXIT_LOCKED
from teibatch.sink import LOCK, OutputStore
from tests.conftest import write_jsonl


@pytest.fixture(scope="module")
def ray_address(ray_session: None) -> Iterator[str]:
    yield ray.get_runtime_context().gcs_address


@pytest.fixture(params=["local", "s3"])
def output(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict[str, Any]]:
    """Where the runs write: a local folder, or a bucket on moto's S3 server (URL, storage_options)."""
    if request.param == "local":
        return str(tmp_path / "out"), {}
    endpoint = request.getfixturevalue("s3_endpoint")
    boto3 = pytest.importorskip("boto3")
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="vectors")
    # Ray workers do not share the test's environment: credentials travel in storage_options.
    return "s3://vectors/overlap", {"key": "testing", "secret": "testing", "skip_instance_cache": True,
                                    "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}}


def slow_job(tmp_path: Path, output: tuple[str, dict[str, Any]], ray_address: str) -> tuple[OutputStore, list[str]]:
    """A 120-document job on one slow simulated GPU (a run lasts seconds after it takes the output):
    the output's store, and the ``teibatch run`` command line of the job."""
    corpus = tmp_path / "corpus"
    for f in range(4):
        write_jsonl(corpus / f"f{f}.jsonl", [{"id": f"{f}-{i}", "text": f"text {i} of file {f}"} for i in range(30)])
    url, storage = output
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "one-run", "corpus": {"path": str(corpus), "id_field": "id", "shard_docs": 10},
        "servers": {"provider": "local", "count": 1, "server_args": ["--simulate-gpu", "100"]},
        "output": {"path": url, "storage_options": storage}, "limits": {"max_shards_in_flight": 1}}))
    return OutputStore(url, storage), [sys.executable, "-m", "teibatch", "run", str(job), "-q", "--ray-address",
                                       ray_address]


@pytest.mark.timeout(300)
def test_an_overlapping_run_is_refused_with_its_own_exit_code_and_writes_nothing(
        tmp_path: Path, ray_address: str, output: tuple[str, dict[str, Any]]) -> None:
    store, command = slow_job(tmp_path, output, ray_address)
    first = subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while (holder := store.read_json(LOCK, fresh=True)) is None and first.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert holder is not None, "the first run took the output's lock"
        second = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True, timeout=120,
                                check=False)
        assert first.poll() is None, "the first run was still going when the second was refused"
        _, first_err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == EXIT_LOCKED, second.stderr
    assert holder["run_id"] in second.stderr and "another teibatch run is writing" in second.stderr
    assert first.returncode == 0, first_err
    # The refused run left no report and no trace in the manifest; the output is one run's.
    assert store.list("runs") == [f"{holder['run_id']}.json"]
    assert store.read_json("_manifest.json", fresh=True)["runs"] == [holder["run_id"]]
    vectors = ds.dataset(store.path("vectors"), filesystem=store.fs, format="parquet")
    ids = vectors.to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 120
    assert store.read_json(LOCK, fresh=True) is None


@pytest.mark.timeout(300)
def test_a_killed_run_s_lock_is_taken_over_by_the_same_command(tmp_path: Path, ray_address: str,
                                                               output: tuple[str, dict[str, Any]]) -> None:
    store, command = slow_job(tmp_path, output, ray_address)
    first = subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while first.poll() is None and time.monotonic() < deadline:
            manifest = store.read_json("_manifest.json", fresh=True)
            if manifest and manifest["shards"]:
                break
            time.sleep(0.05)
        first.send_signal(signal.SIGKILL)  # after its first commit: the lock stays behind
        first.wait(timeout=30)
    finally:
        if first.poll() is None:
            first.kill()
    stale = store.read_json(LOCK, fresh=True)
    assert stale is not None and stale["pid"] == first.pid
    again = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True, timeout=200, check=False)
    assert again.returncode == 0, again.stderr
    report = store.read_json(f"runs/{store.read_json('_manifest.json', fresh=True)['runs'][-1]}.json")
    taken = [e for e in report["events"] if e["event"] == "lock_taken_over"]
    assert [e["previous_run_id"] for e in taken] == [stale["run_id"]]
    vectors = ds.dataset(store.path("vectors"), filesystem=store.fs, format="parquet")
    ids = vectors.to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 120
    assert store.read_json(LOCK, fresh=True) is None
