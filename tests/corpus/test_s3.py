"""Reading a corpus from a real S3-compatible server (moto's, on 127.0.0.1)."""

from __future__ import annotations

import gzip
from typing import Any

import orjson
import pytest

from teibatch.corpus import CorpusOptions, list_sources, plan_shards

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
