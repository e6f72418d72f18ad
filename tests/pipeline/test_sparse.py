"""Sparse (SPLADE) runs end to end: rows equal the server's own ``/embed_sparse`` answers; resume,
incremental and the refusals of dense and sparse vectors in one output."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import JobSpecError, OutputMismatch, WrongModelKind
from teibatch.job import JobSpec, load_job
from teibatch.pipeline import run_job
from teibatch.server import text_digest
from teibatch.tei.packing import PROBE_TEXT
from tests.conftest import write_corpus, write_jsonl

pytestmark = pytest.mark.usefixtures("ray_session")

SPLADE = ("--pooling", "splade", "--record-texts", "--max-client-batch-size", "8", "--max-concurrent-requests", "16")
VOCABULARY = 30522  # the built-in server's SPLADE vocabulary
NO_VIOLATIONS = {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}


def corpus_rows(files: int = 3, per_file: int = 20) -> dict[str, list[dict[str, str]]]:
    return {f"part-{f}.jsonl": [{"id": f"d{f}-{i}", "text": f"file {f} text {i} on topic {i * 7 % 11} and {i % 3}"}
                                for i in range(per_file)] for f in range(files)}


def stats(endpoint: Endpoint) -> dict[str, Any]:
    answer = httpx.get(f"{endpoint.url}/teibatch/stats", headers={"authorization": f"Bearer {endpoint.api_key}"})
    answer.raise_for_status()
    return dict(answer.json())


def asked(endpoint: Endpoint) -> dict[str, int]:
    """Requests the server answered, by route (asking for its stats left out)."""
    return {route: count for route, count in stats(endpoint)["requests"]["by_route"].items()
            if route != "/teibatch/stats"}


def servers_answers(endpoint: Endpoint, texts: list[str]) -> list[tuple[list[int], list[float]]]:
    """The server's own ``/embed_sparse`` answer for each text, asked directly, 8 at a time."""
    rows = []
    for start in range(0, len(texts), 8):
        answer = httpx.post(f"{endpoint.url}/embed_sparse", json={"inputs": texts[start:start + 8]},
                            headers={"authorization": f"Bearer {endpoint.api_key}"})
        answer.raise_for_status()
        rows += [([e["index"] for e in row], [e["value"] for e in row]) for row in answer.json()]
    return rows


def assert_rows_are_the_servers(out: Path, endpoint: Endpoint, live: dict[str, str]) -> None:
    """Every live id once, its ``indices`` and ``values`` those the server answers for its text now."""
    table = ds.dataset(out / "vectors").to_table()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(live)
    got = dict(zip(ids, zip(table.column("indices").to_pylist(), table.column("values").to_pylist(),
                            strict=True), strict=True))
    texts = list(live.values())
    for doc_id, (indices, values) in zip(live, servers_answers(endpoint, texts), strict=True):
        # float32 in Parquet, JSON's shortest float on the wire: equal once both are float32
        assert got[doc_id][0] == indices
        assert pa.array(got[doc_id][1], pa.float32()).equals(pa.array(values, pa.float32()))


@pytest.fixture
def splade(tei_servers: Callable[..., list[Endpoint]],
           monkeypatch: pytest.MonkeyPatch) -> tuple[Endpoint, dict[str, object]]:
    """One built-in server with a SPLADE model and tight limits, and the job's servers section for it."""
    (endpoint,) = tei_servers(1, *SPLADE)
    monkeypatch.setenv("SPLADE_KEY", endpoint.api_key or "")
    return endpoint, {"provider": "static", "urls": [endpoint.url], "api_key_env": "SPLADE_KEY"}


def sparse_job(tmp_path: Path, job_file: Callable[..., Path], splade: tuple[Endpoint, dict[str, object]],
               **sections: Any) -> tuple[JobSpec, dict[str, list[dict[str, str]]], Path]:
    """The job over :func:`corpus_rows` (written to ``corpus/``) in shards of 10, its files, its output."""
    files = corpus_rows()
    write_corpus(tmp_path / "corpus", files)
    job = load_job(job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 10}, splade[1],
                            **sections))
    return job, files, tmp_path / "out"


def test_a_sparse_run_writes_the_servers_answers_and_resumes_one_shard(
        tmp_path: Path, job_file: Callable[..., Path], splade: tuple[Endpoint, dict[str, object]]) -> None:
    job, files, out = sparse_job(tmp_path, job_file, splade)  # model.kind: auto
    endpoint = splade[0]
    assert run_job(job).embedded == 60
    live = {row["id"]: row["text"] for rows in files.values() for row in rows}
    assert_rows_are_the_servers(out, endpoint, live)

    part = sorted((out / "vectors").glob("*.parquet"))[0]
    schema = pq.read_schema(part)
    assert schema.names == ["id", "indices", "values", "content_hash", "truncated"]
    assert schema.field("indices").type == pa.list_(pa.field("element", pa.int32(), nullable=False))
    assert schema.field("values").type == pa.list_(pa.field("element", pa.float32(), nullable=False))
    metadata = orjson.loads(schema.metadata[b"teibatch"])
    assert (metadata["kind"], metadata["vocab_size"], metadata["vector_type"]) == ("sparse", VOCABULARY, "float32")
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    assert (manifest["info"]["kind"], manifest["info"]["vocab_size"]) == ("sparse", VOCABULARY)
    assert dict(stats(endpoint)["violations"]) == NO_VIOLATIONS

    # Resume: one shard's part and its manifest entry gone; the same job sends that shard's texts only.
    shard_id = part.name.removeprefix("part-").removesuffix(".parquet")
    table = pq.read_table(part)
    lost = [live[doc_id] for doc_id in table.column("id").to_pylist()]
    part.unlink()
    del manifest["shards"][shard_id]
    (out / "_manifest.json").write_bytes(orjson.dumps(manifest))
    before = Counter(stats(endpoint)["texts"])
    second = run_job(job)
    sent = Counter(stats(endpoint)["texts"]) - before
    assert (second.embedded, second.shards_committed) == (10, 1)
    assert sent == Counter({text_digest(PROBE_TEXT): 2, **{text_digest(text): 1 for text in lost}})  # 2 probes
    assert_rows_are_the_servers(out, endpoint, live)
    assert dict(stats(endpoint)["violations"]) == NO_VIOLATIONS


def test_an_incremental_sparse_run_sends_only_changed_and_added_texts(
        tmp_path: Path, job_file: Callable[..., Path], splade: tuple[Endpoint, dict[str, object]]) -> None:
    job, files, out = sparse_job(tmp_path, job_file, splade, mode="incremental", model={"kind": "sparse"})
    endpoint = splade[0]
    run_job(job)
    files["part-1.jsonl"][4]["text"] = "a rewritten text for d1-4"
    files["part-1.jsonl"].append({"id": "new", "text": "an added text"})
    write_corpus(tmp_path / "corpus", files)
    before = Counter(stats(endpoint)["texts"])
    second = run_job(job)
    sent = Counter(stats(endpoint)["texts"]) - before
    sent.pop(text_digest(PROBE_TEXT))
    assert sent == Counter({text_digest("a rewritten text for d1-4"): 1, text_digest("an added text"): 1})
    assert (second.embedded, second.reused) == (2, 59)
    assert_rows_are_the_servers(out, endpoint, {row["id"]: row["text"] for rows in files.values() for row in rows})


def test_dense_and_sparse_vectors_never_share_an_output(
        tmp_path: Path, job_file: Callable[..., Path], tei_servers: Callable[..., list[Endpoint]],
        splade: tuple[Endpoint, dict[str, object]], monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "corpus"
    write_corpus(root, corpus_rows(files=1, per_file=5))
    endpoint, sparse_servers = splade
    (dense,) = tei_servers(1, "--record-texts")
    monkeypatch.setenv("DENSE_KEY", dense.api_key or "")
    dense_servers = {"provider": "static", "urls": [dense.url], "api_key_env": "DENSE_KEY"}
    corpus = {"path": str(root), "id_field": "id"}
    run_job(load_job(job_file(corpus, dense_servers)))

    # model.kind: auto meets a SPLADE model, with a new file to embed: refused once the servers are met
    # (with nothing to embed, no server is met), naming the kind.
    write_jsonl(root / "added.jsonl", [{"id": "added", "text": "one more text"}])
    with pytest.raises(OutputMismatch, match=r'model\.kind: stored "dense", this job "sparse"') as caught:
        run_job(load_job(job_file(corpus, sparse_servers)))
    assert caught.value.exit_code == 3
    # Named in the job: refused before any server is asked anything.
    before = asked(endpoint)
    with pytest.raises(OutputMismatch, match=r'model\.kind: stored "dense", this job "sparse"'):
        run_job(load_job(job_file(corpus, sparse_servers, model={"kind": "sparse"})))
    assert asked(endpoint) == before

    # And the other way round: a sparse output refuses dense vectors.
    sparse_out = tmp_path / "sparse-out"
    job = load_job(job_file(corpus, sparse_servers, output={"path": str(sparse_out)}))
    run_job(job)
    with pytest.raises(OutputMismatch, match=r'model\.kind: stored "sparse", this job "dense"'):
        run_job(load_job(job_file(corpus, dense_servers, output={"path": str(sparse_out)},
                                  model={"kind": "dense"})))


def test_sparse_needs_a_splade_model_and_options_that_apply(
        tmp_path: Path, job_file: Callable[..., Path], tei_servers: Callable[..., list[Endpoint]],
        splade: tuple[Endpoint, dict[str, object]], monkeypatch: pytest.MonkeyPatch) -> None:
    root, out = tmp_path / "corpus", tmp_path / "out"
    write_corpus(root, corpus_rows(files=1, per_file=3))
    corpus = {"path": str(root), "id_field": "id"}
    (dense,) = tei_servers(1)
    monkeypatch.setenv("DENSE_KEY", dense.api_key or "")
    dense_servers = {"provider": "static", "urls": [dense.url], "api_key_env": "DENSE_KEY"}
    with pytest.raises(WrongModelKind, match="not a SPLADE model") as caught:
        run_job(load_job(job_file(corpus, dense_servers, model={"kind": "sparse"})))
    assert caught.value.exit_code == 3
    # model.kind: auto finds a SPLADE model, but the job asks for float16 vectors: refused before any work.
    with pytest.raises(JobSpecError, match=r"SPLADE model.*output\.vector_type float16 is for dense vectors"):
        run_job(load_job(job_file(corpus, splade[1], output={"path": str(out), "vector_type": "float16"})))
    assert not list(out.glob("vectors/*.parquet"))


def test_repeated_texts_are_sent_once_and_every_id_gets_the_servers_answer(
        tmp_path: Path, job_file: Callable[..., Path], splade: tuple[Endpoint, dict[str, object]]) -> None:
    # 60 documents, 20 distinct texts: repeats within a shard, across shards and across files
    files = {f"part-{f}.jsonl": [{"id": f"d{f}-{i}", "text": f"shared text {(f * 20 + i) % 20} on topic {i % 5}"}
                                 for i in range(20)] for f in range(3)}
    write_corpus(tmp_path / "corpus", files)
    job = load_job(job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 10}, splade[1]))
    endpoint = splade[0]
    summary = run_job(job)
    live = {row["id"]: row["text"] for rows in files.values() for row in rows}
    assert summary.embedded == 60 and summary.to_json()["documents"]["deduplicated"] == 40
    sent = Counter(stats(endpoint)["texts"])
    assert all(sent[text_digest(text)] == 1 for text in set(live.values()))  # each distinct text once
    assert_rows_are_the_servers(tmp_path / "out", endpoint, live)
