"""Whole runs: local and static servers, output layout and values, rejects, resume."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import RunIncomplete, SinkError, TeiAuthError, WrongModelKind
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.server import HashingEmbedder
from tests.conftest import write_jsonl

pytestmark = pytest.mark.usefixtures("ray_session")


def read_vectors(out: Path) -> dict[str, np.ndarray]:
    table = ds.dataset(out / "vectors").to_table()
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)), "every id appears once"
    vectors = np.array(table.column("embedding").to_pylist(), dtype=np.float32)
    return dict(zip(ids, vectors, strict=True))


def test_local_run_writes_one_row_per_document(small_corpus: Path, job_file: Callable[..., Path],
                                               tmp_path: Path) -> None:
    job = load_job(job_file({"path": str(small_corpus), "id_field": "id", "keep_fields": ["title"],
                             "shard_docs": 10}))
    summary = run_job(job)
    out = tmp_path / "out"
    vectors = read_vectors(out)
    assert len(vectors) == 40
    assert summary.embedded == 40
    assert summary.shards_committed == 5  # a shard never spans files: 25 rows → 3 shards, 15 → 2
    texts = {f"doc-{i:03d}": f"document number {i % 30} about topic {i % 7}" for i in range(40)}
    # The vector for each id is what the server computes for that text.
    expected = HashingEmbedder(384).embed(list(texts.values()))
    for (doc_id, _), want in zip(texts.items(), expected, strict=True):
        np.testing.assert_allclose(vectors[doc_id], want, atol=1e-6)
    table = ds.dataset(out / "vectors").to_table()
    assert set(table.column_names) == {"id", "embedding", "content_hash", "truncated", "title"}
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    assert len(manifest["shards"]) == 5
    assert manifest["info"]["dimension"] == 384
    report = orjson.loads((out / "runs" / f"{summary.run_id}.json").read_bytes())
    assert report["status"] == "done"
    assert report["documents"] == {"read": 40, "embedded": 40, "truncated": 0, "deduplicated": 0,
                                   "skipped_unchanged": 0, "rejected": 0, "waiting_for_servers": 0,
                                   "rejected_by_reason": {}}
    assert sum(s["inputs"] for s in report["servers"].values()) == 40
    assert len(report["servers"]) == 2


def test_identical_texts_get_identical_vectors(tmp_path: Path, job_file: Callable[..., Path]) -> None:
    rows = [{"id": str(i), "text": "the same words" if i % 2 else f"other {i}"} for i in range(20)]
    write_jsonl(tmp_path / "c" / "x.jsonl", rows)
    run_job(load_job(job_file({"path": str(tmp_path / "c"), "id_field": "id", "shard_docs": 3})))
    vectors = read_vectors(tmp_path / "out")
    odd = [vectors[str(i)] for i in range(1, 20, 2)]
    assert all(np.array_equal(v, odd[0]) for v in odd)


def test_static_servers_with_api_key(small_corpus: Path, job_file: Callable[..., Path], tmp_path: Path,
                                     tei_servers: Callable[..., list[Endpoint]],
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    endpoints = tei_servers(2)
    assert all(e.api_key for e in endpoints)
    monkeypatch.setenv("TEST_TEI_KEY", endpoints[0].api_key or "")
    servers = {"provider": "static", "urls": [e.url for e in endpoints], "api_key_env": "TEST_TEI_KEY"}
    job = load_job(job_file({"path": str(small_corpus), "id_field": "id", "shard_docs": 15}, servers))
    summary = run_job(job)
    assert summary.embedded == 40
    assert set(summary.servers) == {e.url for e in endpoints}


def test_static_servers_wrong_key_stops_with_the_env_var_named(
        small_corpus: Path, job_file: Callable[..., Path], tmp_path: Path,
        tei_servers: Callable[..., list[Endpoint]], monkeypatch: pytest.MonkeyPatch) -> None:
    (endpoint,) = tei_servers(1)
    monkeypatch.setenv("TEST_TEI_KEY", "not-the-key")
    servers = {"provider": "static", "urls": [endpoint.url], "api_key_env": "TEST_TEI_KEY"}
    job = load_job(job_file({"path": str(small_corpus)}, servers))
    with pytest.raises(TeiAuthError, match="TEST_TEI_KEY") as caught:
        run_job(job)
    assert caught.value.status_code == 401
    assert "not-the-key" not in str(caught.value)


def test_reranker_server_is_refused_before_any_shard(
        small_corpus: Path, job_file: Callable[..., Path], tmp_path: Path,
        tei_servers: Callable[..., list[Endpoint]], monkeypatch: pytest.MonkeyPatch) -> None:
    (endpoint,) = tei_servers(1, "--model-kind", "reranker", "--model-id", "BAAI/bge-reranker-base")
    monkeypatch.setenv("TEST_TEI_KEY", endpoint.api_key or "")
    servers = {"provider": "static", "urls": [endpoint.url], "api_key_env": "TEST_TEI_KEY"}
    with pytest.raises(WrongModelKind, match="BAAI/bge-reranker-base"):
        run_job(load_job(job_file({"path": str(small_corpus)}, servers)))
    assert not (tmp_path / "out" / "vectors").exists()


def test_bad_documents_are_rejected_and_the_rest_embedded(tmp_path: Path, job_file: Callable[..., Path]) -> None:
    corpus = tmp_path / "c" / "docs.jsonl"
    corpus.parent.mkdir()
    lines = [b'{"id": "ok-1", "text": "fine text"}', b'{"id": "empty", "text": "  "}',
             b'{"id": "missing", "body": "no text field"}', b'{"id": "number", "text": 42}',
             b'{"id": "broken", "text": "unterminated', b'{"id": "ok-2", "text": "also fine"}',
             b'{"id": "long", "text": "' + b"word " * 400 + b'"}']
    corpus.write_bytes(b"\n".join(lines) + b"\n")
    servers = {"provider": "local", "count": 1, "server_args": ["--max-input-length", "64"]}
    job = load_job(job_file({"path": str(corpus.parent), "id_field": "id"}, servers,
                            model={"truncate": False}))
    summary = run_job(job)
    assert sorted(read_vectors(tmp_path / "out")) == ["ok-1", "ok-2"]
    rejects = ds.dataset(tmp_path / "out" / "rejects").to_table().to_pylist()
    reasons = {r["id"]: r["reason"] for r in rejects}
    assert reasons == {"empty": "empty_text", "missing": "missing_text", "number": "non_string_text",
                       "docs.jsonl#4": "malformed_record", "long": "input_too_long"}
    assert all(r["detail"] for r in rejects)
    assert summary.rejected_total == 5


def test_resume_embeds_only_uncommitted_shards(small_corpus: Path, job_file: Callable[..., Path],
                                               tmp_path: Path) -> None:
    job = load_job(job_file({"path": str(small_corpus), "id_field": "id", "shard_docs": 10}))
    run_job(job)
    out = tmp_path / "out"
    first = read_vectors(out)
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    dropped = sorted(manifest["shards"])[:2]
    for shard_id in dropped:
        del manifest["shards"][shard_id]
        (out / "vectors" / f"part-{shard_id}.parquet").unlink()
    (out / "_manifest.json").write_bytes(orjson.dumps(manifest))
    (out / "vectors" / ".tmp-deadbeef-part-x.parquet").write_bytes(b"left by a killed run")
    summary = run_job(job)
    assert summary.shards_skipped == 3
    assert summary.shards_committed == 2
    again = read_vectors(out)
    assert again.keys() == first.keys()
    assert all(np.array_equal(again[k], first[k]) for k in first)
    assert not [p for p in (out / "vectors").iterdir() if p.name.startswith(".tmp-")]
    assert summary.to_json()["documents"]["read"] == sum(
        pq.read_metadata(out / "vectors" / f"part-{s}.parquet").num_rows for s in dropped)


def test_second_run_with_nothing_to_do_launches_nothing(small_corpus: Path, job_file: Callable[..., Path]) -> None:
    job = load_job(job_file({"path": str(small_corpus), "id_field": "id"}))
    run_job(job)
    summary = run_job(job.model_copy(update={"servers": job.servers.model_copy(update={"count": 64})}))
    assert summary.shards_committed == 0
    assert summary.shards_skipped == summary.shards_total == 2  # one shard per file
    assert summary.servers == {}


def test_output_of_another_model_is_refused(small_corpus: Path, job_file: Callable[..., Path]) -> None:
    run_job(load_job(job_file({"path": str(small_corpus)})))
    with pytest.raises(SinkError, match="other model options"):
        run_job(load_job(job_file({"path": str(small_corpus)}, model={"normalize": False})))


def test_unreachable_static_server_is_incomplete_not_a_crash(
        small_corpus: Path, job_file: Callable[..., Path]) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    servers = {"provider": "static", "urls": [f"http://127.0.0.1:{port}"], "startup_timeout": 1}
    from teibatch.errors import CapacityUnavailable

    with pytest.raises(CapacityUnavailable, match="answered /health"):
        run_job(load_job(job_file({"path": str(small_corpus)}, servers)))
    assert RunIncomplete.exit_code == 1


def test_per_server_payload_limit_is_respected(tmp_path: Path, job_file: Callable[..., Path],
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from teibatch.server.testing import running_server, server_stats

    rows = [{"id": str(i), "text": f"document {i} " + "words " * 150} for i in range(120)]
    write_jsonl(tmp_path / "c" / "docs.jsonl", rows)
    monkeypatch.setenv("PAYLOAD_KEY", "k")
    with running_server(api_key="k") as roomy, running_server(api_key="k", payload_limit=8_000) as tight:
        servers = {"provider": "static", "api_key_env": "PAYLOAD_KEY",
                   "urls": [roomy, {"url": tight, "payload_limit": 8_000}]}
        summary = run_job(load_job(job_file({"path": str(tmp_path / "c"), "id_field": "id"}, servers)))
        tight_stats = server_stats(tight)
    assert summary.embedded == 120
    assert tight_stats["inputs_embedded"] > 0
    assert tight_stats["max_body_bytes"] <= 8_000
    assert tight_stats["violations"]["payload"] == 0
