"""The same run reading from and writing to a real S3-compatible server gives the same output."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import boto3
import orjson
import pyarrow.dataset as ds
import pytest
import s3fs

from teibatch.job import JobSpec, load_job
from teibatch.pipeline import run_job
from teibatch.sink import OutputStore, output_status

pytestmark = pytest.mark.usefixtures("ray_session")


def test_s3_run_equals_local_run(small_corpus: Path, job_file: Callable[..., Path], tmp_path: Path,
                                 s3_endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="corpus")
    client.create_bucket(Bucket="vectors")
    for path in sorted(small_corpus.iterdir()):
        client.put_object(Bucket="corpus", Key=f"docs/{path.name}", Body=path.read_bytes())
    # Ray workers do not share the test's environment: credentials travel in storage_options.
    storage = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}

    local = load_job(job_file({"path": str(small_corpus), "id_field": "id", "keep_fields": ["title"],
                               "shard_docs": 10}))
    run_job(local)
    remote = local.model_copy(update={
        "corpus": local.corpus.model_copy(update={"path": "s3://corpus/docs/*.jsonl", "storage_options": storage}),
        "output": local.output.model_copy(update={"path": "s3://vectors/run", "storage_options": storage}),
    })
    summary = run_job(remote)
    assert summary.embedded == 40

    fs = s3fs.S3FileSystem(**storage)
    from_s3 = ds.dataset("vectors/run/vectors", filesystem=fs).to_table().sort_by("id")
    from_disk = ds.dataset(tmp_path / "out" / "vectors").to_table().sort_by("id")
    assert from_s3.equals(from_disk)
    manifest = orjson.loads(fs.cat("vectors/run/_manifest.json"))
    assert len(manifest["shards"]) == 5
    assert not [key for key in fs.find("vectors/run") if ".tmp-" in key]
    state = output_status(OutputStore("s3://vectors/run", storage))
    assert state["shards"]["pending"] == 0
    assert state["documents"]["vectors"] == 40

    again = run_job(remote)  # resume finds everything committed on S3
    assert again.shards_skipped == 5


def s3_job(small_corpus: Path, job_file: Callable[..., Path], s3_endpoint: str, prefix: str, corpus: str,
           output: str, **job: object) -> tuple[JobSpec, dict[str, object]]:
    """The small corpus copied to ``s3://data/<prefix>/``, and a job (with ``job``'s other keys) that reads
    ``corpus`` and writes ``output`` there; with the storage options that reach the S3 server."""
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="data")
    for path in sorted(small_corpus.iterdir()):
        client.put_object(Bucket="data", Key=f"{prefix}/{path.name}", Body=path.read_bytes())
    storage = {"key": "testing", "secret": "testing",
               "client_kwargs": {"endpoint_url": s3_endpoint, "region_name": "us-east-1"}}
    spec = load_job(job_file({"path": str(small_corpus), "id_field": "id", "shard_docs": 10},
                             servers={"provider": "local", "count": 1}, **job))
    return spec.model_copy(update={
        "corpus": spec.corpus.model_copy(update={"path": corpus, "storage_options": storage}),
        "output": spec.output.model_copy(update={"path": output, "storage_options": storage}),
    }), storage


def test_output_under_the_corpus_prefix_is_left_out(small_corpus: Path, job_file: Callable[..., Path],
                                                    s3_endpoint: str) -> None:
    job, storage = s3_job(small_corpus, job_file, s3_endpoint, "c9", "s3://data/c9", "s3://data/c9/out")
    assert job.corpus_options().exclude == ("out",)
    first = run_job(job)
    assert first.status == "done" and first.embedded == 40
    fs = s3fs.S3FileSystem(**storage)
    assert fs.find("data/c9/out/runs") and fs.find("data/c9/out/vectors")

    again = run_job(job)  # out/vectors/*.parquet and out/runs/*.json are not read as documents
    assert again.status == "done"
    assert (again.shards_total, again.shards_skipped, again.embedded, again.rejected_total) == (5, 5, 0, 0)
    ids = ds.dataset("data/c9/out/vectors", filesystem=fs).to_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 40
    assert ds.dataset("data/c9/out/rejects", filesystem=fs).to_table().num_rows == 0


def test_an_edited_file_on_s3_replaces_its_parts_in_place(small_corpus: Path, job_file: Callable[..., Path],
                                                          s3_endpoint: str) -> None:
    job, storage = s3_job(small_corpus, job_file, s3_endpoint, "docs", "s3://data/docs/*.jsonl", "s3://data/out",
                          mode="incremental")
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    assert run_job(job).embedded == 40
    fs = s3fs.S3FileSystem(**storage)
    before = sorted(ds.dataset("data/out/vectors", filesystem=fs).to_table().column("id").to_pylist())
    edited = sorted(small_corpus.iterdir())[0]
    lines = edited.read_text().splitlines()
    client.put_object(Bucket="data", Key=f"docs/{edited.name}", Body="\n".join(lines[:-1]).encode() + b"\n")
    second = run_job(job)  # its new parts are staged, then moved (a copy and a delete) into place
    assert second.status == "done" and second.reused == len(lines) - 1
    ids = ds.dataset("data/out/vectors", filesystem=fs).to_table().column("id").to_pylist()
    assert len(ids) == len(set(ids)) == len(before) - 1
    fs.invalidate_cache()
    assert not [key for key in fs.find("data/out") if ".staged-" in key or ".tmp-" in key]
    assert output_status(OutputStore("s3://data/out", storage))["parts"] == {"missing": [], "wrong_size": []}
