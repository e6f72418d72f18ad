"""Reading a corpus from a real S3-compatible server (moto's, on 127.0.0.1)."""

from __future__ import annotations

import gzip
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli import main
from teibatch.corpus import CorpusOptions, list_sources, plan_shards
from teibatch.errors import CorpusAccessDenied

boto3 = pytest.importorskip("boto3")
pytest.importorskip("s3fs")


def test_jsonl_from_s3(kit: Any, s3_endpoint: str) -> None:
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="corpus")
    rows = kit.docs(7)
    body = b"".join(orjson.dumps(row) + b"\n" for row in rows)
    client.put_object(Bucket="corpus", Key="docs/part-0.jsonl.gz", Body=gzip.compress(body))
    client.put_object(Bucket="corpus", Key="docs/part-1.jsonl", Body=body)
    client.put_object(Bucket="corpus", Key="docs/_SUCCESS", Body=b"")
    storage = {"client_kwargs": {"endpoint_url": s3_endpoint}, "skip_instance_cache": True}

    options = CorpusOptions("s3://corpus/docs/*.jsonl.gz", id_field="id", shard_docs=3,
                            storage_options=storage)
    _, files = list_sources(options)
    assert [(f.path, f.url) for f in files] == [("part-0.jsonl.gz", "corpus/docs/part-0.jsonl.gz")]
    assert "etag=" in files[0].fingerprint
    shards = plan_shards(options)
    assert [(s.start, s.stop) for s in shards] == [(0, 3), (3, 6), (6, 7)]
    assert [(d.id, d.text) for d in kit.read_all(options)] == [(r["id"], r["text"]) for r in rows]

    folder = CorpusOptions("s3://corpus/docs", shard_docs=100, storage_options=storage)
    assert [s.sources for s in plan_shards(folder)] == [("part-0.jsonl.gz",), ("part-1.jsonl",)]
    assert len(kit.read_all(folder)) == 14


@pytest.fixture
def no_credentials(s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """The S3 server's URL, with no credentials anywhere botocore looks, and no instance-metadata lookup
    (it would leave loopback): signing fails before any request is sent."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
                 "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    (tmp_path / "empty").write_text("")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "empty"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "empty"))
    return s3_endpoint


@pytest.mark.parametrize("path", ["s3://corpus/docs/*.jsonl", "s3://corpus/docs/part-0.jsonl"])
def test_missing_credentials_are_a_corpus_error_naming_the_path(path: str, no_credentials: str) -> None:
    options = CorpusOptions(path, storage_options={"client_kwargs": {"endpoint_url": no_credentials},
                                                   "skip_instance_cache": True})
    with pytest.raises(CorpusAccessDenied, match=r"storage refused.*credentials") as refused:
        list_sources(options)
    assert path in str(refused.value)


@pytest.mark.parametrize("where", [pytest.param("corpus", id="corpus"), pytest.param("output", id="output")])
def test_missing_credentials_exit_2_for_the_corpus_and_the_output_alike(where: str, no_credentials: str,
                                                                       tmp_path: Path) -> None:
    (tmp_path / "docs.jsonl").write_text('{"id": "a", "text": "one"}\n')
    storage = {"client_kwargs": {"endpoint_url": no_credentials}, "skip_instance_cache": True}
    local = {"corpus": {"path": str(tmp_path / "docs.jsonl")}, "output": {"path": str(tmp_path / "out")}}
    remote = {"corpus": {"path": "s3://corpus/docs/*.jsonl", "storage_options": storage},
              "output": {"path": "s3://vectors/out", "storage_options": storage}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({**local, where: remote[where], "servers": {"provider": "local", "count": 1}}))
    result = CliRunner().invoke(main, ["run", str(job)])
    assert result.exit_code == 2, result.output
    assert "credentials" in result.stderr and remote[where]["path"] in result.stderr
