"""Quantized outputs end to end: vectors equal the rule applied to the servers' floats, with ranges
calibrated once and reused by every later run."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import OutputMismatch
from teibatch.job import JobSpec
from teibatch.pipeline import run_job
from teibatch.server import text_digest
from teibatch.tei.packing import PROBE_TEXT
from tests.conftest import write_jsonl

pytestmark = pytest.mark.usefixtures("ray_session")


def server_floats(endpoint: Endpoint, texts: list[str]) -> np.ndarray:
    """The float32 vectors the built-in server gives for ``texts`` (its /embed, the job's default options)."""
    vectors = []
    for start in range(0, len(texts), 16):
        answer = httpx.post(f"{endpoint.url}/embed", json={"inputs": texts[start:start + 16], "truncate": True,
                                                           "normalize": True},
                            headers={"authorization": f"Bearer {endpoint.api_key}"}, timeout=30)
        answer.raise_for_status()
        vectors += answer.json()
    return np.asarray(vectors, dtype=np.float32)


def reference(vector_type: str, floats: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The documented rule, in numpy: uint8 = floor(clip((x - min) / ((max - min) / 255), 0, 255)),
    int8 = uint8 - 128, binary = the bits of x > 0 packed most significant first."""
    if vector_type == "binary":
        bits = (floats > 0).astype(np.uint8)
        padded = np.zeros((len(bits), -(-bits.shape[1] // 8) * 8), dtype=np.uint8)
        padded[:, :bits.shape[1]] = bits
        weights = np.array([128, 64, 32, 16, 8, 4, 2, 1], dtype=np.uint8)
        return (padded.reshape(len(bits), -1, 8) * weights).sum(axis=2).astype(np.uint8)
    low64, high64 = low.astype(np.float64), high.astype(np.float64)
    step = (high64 - low64) / 255
    with np.errstate(divide="ignore", invalid="ignore"):
        scaled = np.where(step > 0, (floats.astype(np.float64) - low64) / step, 0.0)
    codes = np.floor(np.clip(scaled, 0, 255)).astype(np.int16)
    return (codes - 128).astype(np.int8) if vector_type == "int8" else codes.astype(np.uint8)


def received(endpoint: Endpoint) -> dict[str, int]:
    stats = httpx.get(f"{endpoint.url}/teibatch/stats", headers={"authorization": f"Bearer {endpoint.api_key}"})
    stats.raise_for_status()
    return stats.json()["texts"]


@pytest.fixture
def server(tei_servers: Callable[..., list[Endpoint]], monkeypatch: pytest.MonkeyPatch) -> Endpoint:
    """One built-in server that records the texts it embeds."""
    (endpoint,) = tei_servers(1, "--record-texts")
    monkeypatch.setenv("QUANT_KEY", endpoint.api_key or "")
    return endpoint


def job_for(tmp_path: Path, endpoint: Endpoint, **output: Any) -> JobSpec:
    return JobSpec.model_validate({
        "name": "quantized", "corpus": {"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 10},
        "servers": {"provider": "static", "urls": [endpoint.url], "api_key_env": "QUANT_KEY"},
        "output": {"path": str(tmp_path / "out"), **output}})


def rows(prefix: str, count: int, words: str) -> list[dict[str, str]]:
    return [{"id": f"{prefix}{i}", "text": f"{words} {i} {'and more ' * (i % 5)}{prefix}"} for i in range(count)]


def stored(tmp_path: Path) -> dict[str, Any]:
    """The output's rows by id: the stored vector and, when written, the float one."""
    table = ds.dataset(tmp_path / "out" / "vectors").to_table()
    floats = (table.column("embedding_float").to_pylist() if "embedding_float" in table.schema.names
              else [None] * table.num_rows)
    return {doc_id: (vector, kept) for doc_id, vector, kept in
            zip(table.column("id").to_pylist(), table.column("embedding").to_pylist(), floats, strict=True)}


@pytest.mark.parametrize(("vector_type", "keep_float"), [
    pytest.param("int8", True, id="int8-keep-float"), pytest.param("uint8", False, id="uint8"),
    pytest.param("binary", False, id="binary")])
def test_vectors_equal_the_reference_quantization_of_the_servers_floats(
        tmp_path: Path, server: Endpoint, vector_type: str, keep_float: bool) -> None:
    corpus = rows("a", 24, "a note on rivers") + rows("b", 21, "the price of tea")
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", corpus)
    run_job(job_for(tmp_path, server, vector_type=vector_type, keep_float=keep_float))

    floats = server_floats(server, [row["text"] for row in corpus])
    low, high = floats.min(axis=0), floats.max(axis=0)  # the whole corpus is under the calibration sample
    expected = reference(vector_type, floats, low, high)
    written = stored(tmp_path)
    assert sorted(written) == sorted(row["id"] for row in corpus)
    for row, want, float_vector in zip(corpus, expected, floats, strict=True):
        vector, kept = written[row["id"]]
        assert vector == want.tolist(), row["id"]
        if keep_float:
            np.testing.assert_array_equal(np.asarray(kept, dtype=np.float32), float_vector)

    manifest = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())
    metadata = orjson.loads(pq.read_schema(next((tmp_path / "out" / "vectors").glob("*.parquet")))
                            .metadata[b"teibatch"])
    assert metadata["quantization"] == manifest["quantization"]
    if vector_type != "binary":
        assert manifest["quantization"]["sample"] == len(corpus)
        assert manifest["quantization"]["min"] == low.tolist() and manifest["quantization"]["max"] == high.tolist()
    else:
        assert manifest["quantization"]["bit_order"] == "big"


def test_resume_and_a_grown_corpus_reuse_the_stored_calibration(tmp_path: Path, server: Endpoint) -> None:
    write_jsonl(tmp_path / "corpus" / "m.jsonl", rows("m", 30, "a quiet morning"))
    job = job_for(tmp_path, server, vector_type="int8")
    run_job(job)
    manifest_path = tmp_path / "out" / "_manifest.json"
    calibration = orjson.loads(manifest_path.read_bytes())["quantization"]

    # A run that stopped before its last shard: the same command resumes it.
    manifest = orjson.loads(manifest_path.read_bytes())
    dropped = sorted(manifest["shards"])[-1]
    del manifest["shards"][dropped]
    dropped_ids = _ids_of(tmp_path, dropped)
    (tmp_path / "out" / "vectors" / f"part-{dropped}.parquet").unlink()
    manifest_path.write_bytes(orjson.dumps(manifest))
    # And the corpus grew, with a file planned first whose texts reach far outside the calibrated ranges.
    grown = rows("a", 12, "zebra quantum violin") + rows("x", 8, "!!! ??? ###")
    write_jsonl(tmp_path / "corpus" / "a.jsonl", grown)
    before = received(server)
    run_job(job)

    after = orjson.loads(manifest_path.read_bytes())
    assert after["quantization"] == calibration, "never calibrated again"
    sent = {digest: after_count - before.get(digest, 0) for digest, after_count in received(server).items()
            if after_count != before.get(digest)}
    sent.pop(text_digest(PROBE_TEXT), None)
    resumed = [row for row in rows("m", 30, "a quiet morning") if row["id"] in dropped_ids]
    assert sent == {text_digest(row["text"]): 1 for row in grown + resumed}, "only the new and resumed texts"
    low, high = np.asarray(calibration["min"]), np.asarray(calibration["max"])
    everything = rows("m", 30, "a quiet morning") + grown
    floats = server_floats(server, [row["text"] for row in everything])
    written = stored(tmp_path)
    for row, want in zip(everything, reference("int8", floats, low, high), strict=True):
        assert written[row["id"]][0] == want.tolist(), row["id"]


def _ids_of(tmp_path: Path, shard_id: str) -> set[str]:
    table = pq.read_table(tmp_path / "out" / "vectors" / f"part-{shard_id}.parquet", columns=["id"])
    return set(table.column("id").to_pylist())


def test_incremental_reuse_keeps_the_stored_codes(tmp_path: Path, server: Endpoint) -> None:
    corpus = rows("d", 20, "a long road home")
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", corpus)
    job = JobSpec.model_validate({**job_for(tmp_path, server, vector_type="uint8").model_dump(),
                                  "mode": "incremental"})
    first = run_job(job)
    before = stored(tmp_path)
    corpus[4]["text"] = "this document changed"
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", corpus)
    second = run_job(job)
    assert (first.embedded, second.embedded, second.reused) == (20, 1, 19)
    after = stored(tmp_path)
    assert {k: v for k, v in after.items() if k != "d4"} == {k: v for k, v in before.items() if k != "d4"}


@pytest.mark.parametrize(("output", "named"), [
    pytest.param({"vector_type": "binary"}, 'output.vector_type: stored "int8", this job "binary"', id="vector-type"),
    pytest.param({"vector_type": "int8", "keep_float": True}, "output.keep_float: stored false, this job true",
                 id="keep-float"),
])
def test_another_vector_type_or_keep_float_is_refused(tmp_path: Path, server: Endpoint, output: dict[str, Any],
                                                       named: str) -> None:
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows("d", 6, "short"))
    run_job(job_for(tmp_path, server, vector_type="int8"))
    with pytest.raises(OutputMismatch) as caught:
        run_job(job_for(tmp_path, server, **output))
    assert named in str(caught.value), str(caught.value)
    assert str(caught.value).count(": stored ") == 1


def test_a_chunked_output_calibrates_on_its_chunks(tmp_path: Path, server: Endpoint) -> None:
    corpus = [{"id": f"d{i}", "text": " ".join(f"word{(i * 7 + j) % 23} token{j}" for j in range(40))}
              for i in range(6)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", corpus)
    job = JobSpec.model_validate({**job_for(tmp_path, server, vector_type="int8").model_dump(),
                                  "chunking": {"strategy": "tokens", "max_tokens": 24, "store_text": True,
                                               "tokenizer": "builtin-hashing"}})
    run_job(job)
    table = ds.dataset(tmp_path / "out" / "vectors").to_table()
    texts = table.column("text").to_pylist()
    assert len(texts) > len(corpus)  # cut into chunks
    floats = server_floats(server, texts)
    calibration = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())["quantization"]
    assert calibration["sample"] == len(texts)
    assert calibration["min"] == floats.min(axis=0).tolist()
    expected = reference("int8", floats, floats.min(axis=0), floats.max(axis=0))
    assert table.column("embedding").to_pylist() == expected.tolist()
