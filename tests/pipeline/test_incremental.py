"""Incremental runs: only changed and added texts reach the servers; removed documents drop out."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow.dataset as ds
import pytest

from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.server import HashingEmbedder, text_digest
from teibatch.tei.packing import PROBE_TEXT
from tests.conftest import write_corpus, write_jsonl

pytestmark = pytest.mark.usefixtures("ray_session")

FILES = 4
PER_FILE = 50


def corpus_rows() -> dict[str, list[dict[str, str]]]:
    return {f"part-{f}.jsonl": [{"id": f"d{f}-{i}", "text": f"file {f} document {i} says hello {i * 7 % 13}"}
                                for i in range(PER_FILE)] for f in range(FILES)}


def received(endpoint: Endpoint) -> dict[str, int]:
    """The texts a server embedded, as digest → count (``--record-texts``)."""
    stats = httpx.get(f"{endpoint.url}/teibatch/stats", headers={"authorization": f"Bearer {endpoint.api_key}"})
    stats.raise_for_status()
    return stats.json()["texts"]


@pytest.fixture
def recording(tei_servers: Callable[..., list[Endpoint]],
              monkeypatch: pytest.MonkeyPatch) -> tuple[Endpoint, dict[str, object]]:
    """One built-in server that records the texts it embeds, and the job's servers section for it."""
    (endpoint,) = tei_servers(1, "--record-texts")
    monkeypatch.setenv("INC_KEY", endpoint.api_key or "")
    return endpoint, {"provider": "static", "urls": [endpoint.url], "api_key_env": "INC_KEY"}


def test_rerun_sends_only_changed_and_added_texts(tmp_path: Path, job_file: Callable[..., Path],
                                                   recording: tuple[Endpoint, dict[str, object]]) -> None:
    root = tmp_path / "corpus"
    files = corpus_rows()
    write_corpus(root, files)
    endpoint, servers = recording
    job = load_job(job_file({"path": str(root), "id_field": "id", "shard_docs": 20}, servers, mode="incremental"))
    first = run_job(job)
    assert first.embedded == FILES * PER_FILE
    before = received(endpoint)

    # Change 2% of the documents (in two files), delete three, add two in a new file.
    files["part-0.jsonl"][3]["text"] = "a brand new text for d0-3"
    files["part-2.jsonl"][40]["text"] = "d2-40 was rewritten entirely"
    deleted = [files["part-1.jsonl"].pop(10)["id"], files["part-1.jsonl"].pop(10)["id"],
               files["part-3.jsonl"].pop()["id"]]
    files["part-9.jsonl"] = [{"id": "new-1", "text": "an added document"},
                             {"id": "new-2", "text": "another added document"}]
    write_corpus(root, files)
    second = run_job(job)

    after = received(endpoint)
    sent = {digest: after[digest] - before.get(digest, 0) for digest in after if after[digest] != before.get(digest)}
    changed = ["a brand new text for d0-3", "d2-40 was rewritten entirely", "an added document",
               "another added document"]
    sent.pop(text_digest(PROBE_TEXT), None)  # each run checks each server once with a probe request
    assert sent == {text_digest(text): 1 for text in changed}
    assert second.embedded == 4
    live = {row["id"]: row["text"] for rows in files.values() for row in rows}
    assert second.reused == len(live) - 4

    table = ds.dataset(tmp_path / "out" / "vectors").to_table()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(live), "the current view holds exactly the live ids, once each"
    assert not set(deleted) & set(ids)
    vectors = dict(zip(ids, np.array(table.column("embedding").to_pylist(), dtype=np.float32), strict=True))
    expected = HashingEmbedder(384).embed(list(live.values()))
    for doc_id, want in zip(live, expected, strict=True):
        np.testing.assert_allclose(vectors[doc_id], want, atol=1e-6)
    manifest = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())
    assert sorted(manifest["shards"]) == sorted(manifest["planned"])


def test_full_mode_reembeds_changed_files_entirely(tmp_path: Path, job_file: Callable[..., Path]) -> None:
    root = tmp_path / "corpus"
    files = corpus_rows()
    write_corpus(root, files)
    job = load_job(job_file({"path": str(root), "id_field": "id", "shard_docs": 20}))
    run_job(job)
    files["part-0.jsonl"][0]["text"] = "changed"
    write_jsonl(root / "part-0.jsonl", files["part-0.jsonl"])
    second = run_job(job)
    assert second.embedded == PER_FILE  # the whole changed file, nothing reused
    assert second.reused == 0
    assert ds.dataset(tmp_path / "out" / "vectors").count_rows() == FILES * PER_FILE


CHUNKING = {"strategy": "sentences", "max_tokens": 24, "overlap_tokens": 6}


def chunked_rows() -> dict[str, list[dict[str, str]]]:
    return {f"part-{f}.jsonl": [{"id": f"d{f}-{i}", "text": " ".join(
        f"Sentence {s} of document {i} in file {f} says {'hello ' * (s % 4)}there." for s in range(2 + i % 5))}
        for i in range(12)] for f in range(3)}


def chunk_table(out: Path) -> dict[str, list[object]]:
    table = ds.dataset(out / "vectors").to_table().sort_by("id")
    return {name: table.column(name).to_pylist() for name in table.column_names}


def test_incremental_chunked_run_equals_a_fresh_run_row_for_row(tmp_path: Path, job_file: Callable[..., Path],
                                                                recording: tuple[Endpoint, dict[str, object]]) -> None:
    root = tmp_path / "corpus"
    files = chunked_rows()
    write_corpus(root, files)
    endpoint, servers = recording
    corpus = {"path": str(root), "id_field": "id", "shard_docs": 6}
    job = load_job(job_file(corpus, servers, mode="incremental", chunking=CHUNKING))
    run_job(job)
    before = received(endpoint)
    long_one = max(files["part-0.jsonl"], key=lambda row: len(row["text"]))
    long_one["text"] = "Now it is short."  # fewer chunks: its old chunks beyond the first must go
    files["part-1.jsonl"][0]["text"] += " One more sentence at the end."  # only its last chunks change
    deleted = files["part-2.jsonl"].pop(3)["id"]
    files["part-9.jsonl"] = [{"id": "new", "text": "An added document. It has two sentences."}]
    write_corpus(root, files)
    second = run_job(job)
    after = received(endpoint)
    sent = sum(after[digest] - before.get(digest, 0) for digest in after) - 1  # less the probe
    incremental = chunk_table(tmp_path / "out")

    fresh_job = load_job(job_file(corpus, servers, chunking=CHUNKING, output={"path": str(tmp_path / "fresh")}))
    fresh_summary = run_job(fresh_job)
    fresh = chunk_table(tmp_path / "fresh")
    assert incremental == fresh  # ids, hashes, vectors, chunk places: row for row
    assert not [i for i in incremental["id"] if str(i).startswith(f"{deleted}#")]
    assert [i for i in incremental["id"] if str(i).startswith(f"{long_one['id']}#")] == [f"{long_one['id']}#0"]
    assert second.reused > 0 and second.embedded == 3  # the two changed documents and the added one
    chunking = second.to_json()["chunking"]
    assert 0 < sent == chunking["chunks"] - chunking["chunks_reused"] < fresh_summary.to_json()["chunking"]["chunks"]
