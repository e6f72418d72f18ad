"""Never commit a lie (issue #12), end to end: whole ``teibatch run`` processes against misbehaving servers
and bad inputs.

Each test starts its own stand-ins (:mod:`tests.reliability.standins`), runs ``teibatch run`` in a
subprocess on the session's Ray, and then says where *every* document ended: a vector in
``vectors/`` (the stand-in's healthy vector for its text, checked value for value), a final reject
in ``rejects/``, or still to do (its shard not in ``_manifest.json``). Then the fault is fixed and the
same command is run again: it must end with every valid document embedded exactly once.
"""

from __future__ import annotations

import gzip
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import ray
import yaml

from teibatch.tei.packing import PROBE_TEXT
from tests.conftest import write_jsonl
from tests.reliability.standins import Behaviour, StandIn, vector_for

MODEL = "stand-in/hashing"
"""What a stand-in's ``/info`` reports as ``model_id``: the jobs ask for it."""
DIMENSION = 16
RUN_TIMEOUT_S = 150
GIVE_UP_BOUND_S = 60.0
"""A run whose only server answers wrongly stops within this: 3 failures, 30 s with no server, exit 1."""

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def ray_address(ray_session: None) -> Iterator[str]:
    yield ray.get_runtime_context().gcs_address


# -- running -------------------------------------------------------------------------------------


@dataclass
class Ran:
    code: int
    stdout: str
    stderr: str
    seconds: float

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def run(job: Path, address: str | None, *, env: dict[str, str] | None = None,
        timeout: float = RUN_TIMEOUT_S) -> Ran:
    """``teibatch run JOB -q`` in a subprocess on the session's Ray."""
    command = [sys.executable, "-m", "teibatch", "run", str(job), "-q"]
    if address is not None:
        command += ["--ray-address", address]
    started = time.monotonic()
    done = subprocess.run(command, env={**os.environ, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout, check=False)
    return Ran(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def static(*servers: StandIn, **settings: Any) -> dict[str, Any]:
    return {"provider": "static", "urls": [s.url for s in servers], "startup_timeout": 5, **settings}


def write_job(path: Path, corpus: dict[str, Any], servers: dict[str, Any], out: Path, **sections: Any) -> Path:
    spec = {"name": "never-lie", "corpus": {"id_field": "id", "shard_docs": 10, **corpus},
            "model": {"id": MODEL}, "servers": servers, "output": {"path": str(out)},
            **sections}
    spec["client"] = {"request_timeout": 5, **sections.get("client", {})}
    path.write_text(yaml.safe_dump(spec))
    return path


def documents(count: int, prefix: str = "d") -> list[dict[str, Any]]:
    return [{"id": f"{prefix}{i:03d}", "text": f"document {i} of {prefix}, about topic {i % 7}"}
            for i in range(count)]


def corpus_of(tmp_path: Path, count: int) -> tuple[list[dict[str, Any]], Path]:
    """``count`` documents written as the test's corpus (``tmp_path / "c"``): the rows, and the output path."""
    rows = documents(count)
    write_jsonl(tmp_path / "c" / "docs.jsonl", rows)
    return rows, tmp_path / "out"


# -- where every document ended ------------------------------------------------------------------


@dataclass
class Ended:
    """An output as a reader finds it."""

    vectors: dict[str, np.ndarray]
    vector_rows: int
    rejects: dict[str, str]
    committed: set[str]
    planned: list[str]
    dimension: int | None
    reports: list[dict[str, Any]]

    @property
    def last_report(self) -> dict[str, Any]:
        return self.reports[-1]


def ended(out: Path) -> Ended:
    vectors: dict[str, np.ndarray] = {}
    rows = 0
    dimension = None
    if (out / "vectors").exists() and any((out / "vectors").glob("*.parquet")):
        table = ds.dataset(out / "vectors").to_table()  # one dataset: every part has one schema
        rows = table.num_rows
        dimension = table.schema.field("embedding").type.list_size
        vectors = dict(zip(table.column("id").to_pylist(),
                           np.array(table.column("embedding").to_pylist(), dtype=np.float32).reshape(rows, dimension),
                           strict=True))
    rejects: dict[str, str] = {}
    if (out / "rejects").exists() and any((out / "rejects").glob("*.parquet")):
        for row in ds.dataset(out / "rejects").to_table().to_pylist():
            rejects[row["id"]] = row["reason"]
    manifest = orjson.loads((out / "_manifest.json").read_bytes()) if (out / "_manifest.json").exists() else {}
    reports = [orjson.loads(p.read_bytes()) for p in sorted((out / "runs").glob("*.json"), key=os.path.getmtime)] \
        if (out / "runs").exists() else []
    return Ended(vectors, rows, rejects, set(manifest.get("shards", {})), list(manifest.get("planned", [])),
                 dimension, reports)


def assert_nothing_committed(out: Path) -> None:
    state = ended(out)
    assert state.committed == set()
    assert state.vector_rows == 0 and state.rejects == {}
    assert not [p for p in out.rglob("*.parquet")], "no part written for an uncommitted shard"


def assert_embedded_once(out: Path, texts: dict[str, str], dimension: int = DIMENSION) -> Ended:
    """Every id of ``texts`` has exactly one row, holding the stand-in's healthy vector of its text."""
    state = ended(out)
    assert state.vector_rows == len(state.vectors), "an id appears twice in vectors/"
    assert sorted(state.vectors) == sorted(texts)
    assert state.dimension == dimension
    for doc_id, text in texts.items():
        np.testing.assert_allclose(state.vectors[doc_id], vector_for(text, dimension), rtol=0, atol=1e-6,
                                   err_msg=doc_id)
    assert set(state.planned) <= state.committed
    assert not [p for p in out.rglob("*") if p.name.startswith(".tmp-")]
    return state


def embedding_requests(server: StandIn) -> int:
    requests = server.stats().requests
    return requests["/embed"] + requests["/v1/embeddings"]


# -- 1. a server that answers wrongly ------------------------------------------------------------

WRONG_ANSWERS = [
    pytest.param(Behaviour.WRONG_DIMENSION, id="wrong-dimension"),
    pytest.param(Behaviour.HTML_502, id="html-502"),
]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("behaviour", WRONG_ANSWERS)
def test_only_server_answering_wrongly_stops_the_run_and_commits_nothing(
        behaviour: Behaviour, tmp_path: Path, ray_address: str) -> None:
    rows, out = corpus_of(tmp_path, 40)
    # healthy_first=1: teibatch meets it with a probe that passes; it goes wrong once the work starts.
    with StandIn(behaviour, dimension=DIMENSION, healthy_first=1) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(server), out)
        broken = run(job, ray_address)
        print(f"broken run: exit {broken.code} in {broken.seconds:.1f}s")
        assert broken.code == 1, broken.output
        assert broken.seconds < GIVE_UP_BOUND_S, f"took {broken.seconds:.1f}s to give up"
        assert server.url in broken.stderr
        assert_nothing_committed(out)
        state = ended(out)
        assert state.last_report["status"] != "done"
        assert len(state.planned) == 4

        server.behave(Behaviour.HEALTHY)
        fixed = run(job, ray_address)
    assert fixed.code == 0, fixed.output
    assert_embedded_once(out, {r["id"]: r["text"] for r in rows})
    assert ended(out).last_report["status"] == "done"


@pytest.mark.timeout(120)
@pytest.mark.parametrize("behaviour", WRONG_ANSWERS)
def test_server_answering_wrongly_beside_a_healthy_one_is_taken_out(
        behaviour: Behaviour, tmp_path: Path, ray_address: str) -> None:
    rows, out = corpus_of(tmp_path, 60)
    with StandIn(behaviour, dimension=DIMENSION, healthy_first=1) as bad, StandIn(dimension=DIMENSION) as good:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(bad, good), out,
                        client={"max_batch_size": 4})
        done = run(job, ray_address)
        print(f"run: exit {done.code} in {done.seconds:.1f}s")
        bad_requests, good_requests = embedding_requests(bad), embedding_requests(good)
    assert done.code == 0, done.output
    assert_embedded_once(out, {r["id"]: r["text"] for r in rows})
    report = ended(out).last_report
    assert report["status"] == "done"
    assert report["servers"][bad.url]["marked_down"] >= 1
    assert report["servers"][bad.url]["inputs"] == 0  # not one of its answers was kept
    # Taken out after 3 wrong answers: a few more (requests already in flight, probes once a second).
    assert bad_requests <= 3 + 8 + done.seconds, (bad_requests, good_requests)
    assert good_requests >= 60 // 4


# -- 2. NaN and infinity on the base64 route -----------------------------------------------------


@pytest.mark.timeout(240)
def test_non_finite_vectors_on_base64_are_never_stored(tmp_path: Path, ray_address: str) -> None:
    rows, out = corpus_of(tmp_path, 30)
    with StandIn(Behaviour.NON_FINITE, dimension=DIMENSION, healthy_first=1) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(server), out,
                        client={"route": "openai-base64"})
        broken = run(job, ray_address)
        assert broken.code == 1, broken.output
        assert broken.seconds < GIVE_UP_BOUND_S
        assert "NaN or infinite" in broken.stderr
        assert server.stats().requests["/embed"] == 0  # every request went by the base64 route
        assert_nothing_committed(out)
        assert ended(out).last_report["status"] != "done"

        server.behave(Behaviour.HEALTHY)
        fixed = run(job, ray_address)
    assert fixed.code == 0, fixed.output
    state = assert_embedded_once(out, {r["id"]: r["text"] for r in rows})
    assert all(np.isfinite(vector).all() for vector in state.vectors.values())
    assert orjson.loads((out / "_manifest.json").read_bytes())["info"]["route"] == "openai-base64"


# -- 3. a resume against servers of another dimension --------------------------------------------


@pytest.mark.timeout(240)
@pytest.mark.parametrize("mode", ["full", "incremental"])
def test_resume_against_another_dimension_stops_before_any_work(mode: str, tmp_path: Path,
                                                                 ray_address: str) -> None:
    rows, out = corpus_of(tmp_path, 50)
    with StandIn(dimension=384) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(server), out, mode=mode,
                        limits={"max_shards_in_flight": 1})
        crashed = run(job, ray_address, env={"TEIBATCH_CRASH_AT": "commit:1"})
        assert crashed.code == -9, crashed.output  # SIGKILL right after the first shard was committed
        first = ended(out)
        assert len(first.committed) == 1 and first.vector_rows == 10 and first.dimension == 384

        server.resize(768)  # the same model id, restarted with another size
        before = embedding_requests(server)
        refused = run(job, ray_address)
        assert refused.code == 2, refused.output
        assert "384" in refused.stderr and "768" in refused.stderr, refused.stderr
        assert embedding_requests(server) - before == 1  # the probe that met the server, no work
        after = ended(out)
        assert after.committed == first.committed and after.dimension == 384 and after.vector_rows == 10
        assert after.last_report["status"] == "failed"
        assert pq.read_schema(next((out / "vectors").glob("*.parquet"))).field("embedding").type.list_size == 384

        server.resize(384)  # back to the output's servers: the same command finishes
        fixed = run(job, ray_address)
    assert fixed.code == 0, fixed.output
    assert_embedded_once(out, {r["id"]: r["text"] for r in rows}, dimension=384)


# -- 4. a CSV quote that never closes ------------------------------------------------------------


def csv_with_stray_quote(path: Path, rows: int = 1001, bad_row: int | None = 11) -> dict[str, str]:
    """``rows`` records, record ``bad_row`` (line ``bad_row + 1``) opening a quote it never closes."""
    texts = {f"r{i}": f"document {i}" for i in range(1, rows + 1)}
    lines = ["id,text"] + [f"{doc_id},{text}" for doc_id, text in texts.items()]
    if bad_row is not None:
        lines[bad_row] = f'r{bad_row},"document {bad_row} opens a quote'
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return texts


@pytest.mark.timeout(240)
def test_csv_quote_that_never_closes_stops_with_file_and_line(tmp_path: Path, ray_address: str) -> None:
    texts = csv_with_stray_quote(tmp_path / "c" / "docs.csv")
    out = tmp_path / "out"
    with StandIn(dimension=DIMENSION) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c"), "format": "csv", "shard_docs": 500},
                        static(server), out)
        refused = run(job, ray_address)
        assert refused.code == 2, refused.output
        assert "docs.csv:12" in refused.stderr and "never closes" in refused.stderr, refused.stderr
        assert not out.exists() or not list(out.rglob("*.parquet"))  # nothing of the file, merged or not
        assert ended(out).committed == set()

        csv_with_stray_quote(tmp_path / "c" / "docs.csv", bad_row=None)  # fixed
        fixed = run(job, ray_address)
    assert fixed.code == 0, fixed.output
    assert_embedded_once(out, texts)


@pytest.mark.timeout(240)
def test_csv_quote_that_never_closes_rejects_the_rest_when_asked(tmp_path: Path, ray_address: str) -> None:
    texts = csv_with_stray_quote(tmp_path / "c" / "docs.csv")
    out = tmp_path / "out"
    with StandIn(dimension=DIMENSION) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c"), "format": "csv", "shard_docs": 500,
                                                "on_bad_file": "reject"}, static(server), out)
        done = run(job, ray_address)
        sent = server.stats().texts
    assert done.code == 0, done.output
    # docs/output.md, "Bad files": the rows before the bad point are embedded; one malformed_record
    # reject for each non-blank line from the bad record to the end of the file, detail "file#row (line N)".
    state = assert_embedded_once(out, {f"r{i}": texts[f"r{i}"] for i in range(1, 11)})
    assert len(state.rejects) == 991 and set(state.rejects.values()) == {"malformed_record"}
    details = {r["detail"].split(": ", 1)[0] for r in ds.dataset(out / "rejects").to_table().to_pylist()}
    assert details == {f"docs.csv#{line - 2} (line {line})" for line in range(12, 1003)}
    # No merged text was ever sent: only the 10 rows before the bad one, and the probe that met the server.
    assert sorted(t for t in sent if t != PROBE_TEXT) == sorted(texts[f"r{i}"] for i in range(1, 11))
    assert len(sent) == 11
    assert state.last_report["documents"]["rejected_by_reason"] == {"malformed_record": 991}


# -- 5. servers that never answer, or trickle ----------------------------------------------------


@pytest.mark.timeout(180)
@pytest.mark.parametrize("behaviour", [pytest.param(Behaviour.HANG, id="never-answers"),
                                       pytest.param(Behaviour.TRICKLE, id="trickles-1-byte-a-second")])
def test_a_server_that_never_finishes_an_answer_beside_a_healthy_one(
        behaviour: Behaviour, tmp_path: Path, ray_address: str) -> None:
    rows, out = corpus_of(tmp_path, 40)
    with StandIn(behaviour, dimension=DIMENSION, healthy_first=1, trickle_bytes_per_s=1) as slow, \
            StandIn(dimension=DIMENSION) as good:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(slow, good), out,
                        client={"request_timeout": 2, "max_batch_size": 4})
        done = run(job, ray_address)
    assert done.code == 0, done.output
    assert done.seconds < 60, f"took {done.seconds:.1f}s"
    assert_embedded_once(out, {r["id"]: r["text"] for r in rows})
    servers = ended(out).last_report["servers"]
    assert servers[slow.url]["inputs"] == 0
    # Its requests timed out and it was taken out, or, at the end of the run, the healthy server
    # answered copies of them first (tail hedging) and the run ended before their timeouts.
    assert servers[slow.url]["marked_down"] >= 1 or servers[good.url]["copies_won"] >= 1, servers


# -- 6. bad files, bad outputs, bad job files, bad /info, ids -------------------------------------


def gzip_jsonl(path: Path, rows: list[dict[str, Any]]) -> bytes:
    data = gzip.compress(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return data


@pytest.mark.timeout(240)
def test_truncated_gzip_fails_its_shards_only_and_the_same_command_finishes_after_the_fix(
        tmp_path: Path, ray_address: str) -> None:
    corpus = tmp_path / "c"
    a, b, c = documents(20, "a"), documents(60, "b"), documents(20, "c")
    gzip_jsonl(corpus / "a.jsonl.gz", a)
    good_b = gzip_jsonl(corpus / "b.jsonl.gz", b)
    gzip_jsonl(corpus / "c.jsonl.gz", c)
    (corpus / "b.jsonl.gz").write_bytes(good_b[: len(good_b) // 2])  # cut off mid-stream
    out = tmp_path / "out"
    with StandIn(dimension=DIMENSION) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(corpus)}, static(server), out)
        broken = run(job, ray_address)
        assert broken.code == 2, broken.output
        assert "b.jsonl.gz" in broken.stderr, broken.stderr
        state = ended(out)
        assert sorted(state.vectors) == sorted(r["id"] for r in a + c)
        assert state.rejects == {}
        assert set(state.planned) - state.committed, "the bad file's shards are still to do"
        assert len(state.committed) == 4  # a and c: 2 shards each

        (corpus / "b.jsonl.gz").write_bytes(good_b)
        fixed = run(job, ray_address)
    assert fixed.code == 0, fixed.output
    state = assert_embedded_once(out, {r["id"]: r["text"] for r in a + b + c})
    assert state.last_report["shards"]["skipped_committed"] == 4


@pytest.mark.timeout(120)
def test_unwritable_output_stops_before_any_server_is_asked(tmp_path: Path, ray_address: str) -> None:
    write_jsonl(tmp_path / "c" / "docs.jsonl", documents(20))
    (tmp_path / "a-file").write_text("a regular file: nothing can be created under it, not even by root")
    with StandIn(dimension=DIMENSION) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(server),
                        tmp_path / "a-file" / "out")
        refused = run(job, ray_address)
        seen = server.stats().requests
    assert refused.code == 2, refused.output
    assert "a-file" in refused.stderr
    assert seen == {}, "not even /health was asked"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("content", "line", "says"), [
    pytest.param('name: x\ncorpus:\n  path: ./c\noutput:\n  path: "caf\xe9"\n'.encode("latin-1"), 5, "not UTF-8",
                 id="not-utf8"),
    pytest.param(b"name: x\ncorpus:\n  path: ./c\n  path: ./d\noutput:\n  path: ./out\n", 4, "duplicate key",
                 id="duplicate-key"),
])
def test_a_broken_job_file_is_refused_naming_file_and_line(content: bytes, line: int, says: str,
                                                          tmp_path: Path, ray_address: str) -> None:
    job = tmp_path / "job.yaml"
    job.write_bytes(content)
    refused = run(job, ray_address)
    assert refused.code == 2, refused.output
    assert f"{job}:{line}" in refused.stderr and says in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()


@pytest.mark.timeout(120)
def test_info_with_max_client_batch_size_0_sends_one_input_a_request(tmp_path: Path, ray_address: str) -> None:
    rows, out = corpus_of(tmp_path, 20)
    with StandIn(dimension=DIMENSION, info={"max_client_batch_size": 0}) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(server), out)
        done = run(job, ray_address)
        stats = server.stats()
    assert done.code == 0, done.output
    assert f"{server.url}: /info max_client_batch_size is 0; using 1" in done.stderr, done.stderr
    assert_embedded_once(out, {r["id"]: r["text"] for r in rows})
    # Every embedding request carried one input (the probe included): as many texts as requests.
    assert len(stats.texts) == stats.requests["/embed"] + stats.requests["/v1/embeddings"] == 21


@pytest.mark.timeout(120)
def test_the_id_rule_in_a_whole_run(tmp_path: Path, ray_address: str) -> None:
    rows: list[dict[str, Any]] = documents(30)
    rows[3]["id"] = ""
    rows[7]["id"] = None
    rows[11]["id"] = 12345
    write_jsonl(tmp_path / "c" / "docs.jsonl", rows)
    out = tmp_path / "out"
    with StandIn(dimension=DIMENSION) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c")}, static(server), out)
        done = run(job, ray_address)
    assert done.code == 0, done.output
    # docs/output.md, "Ids": an integer becomes its decimal string; "" and null are malformed_record,
    # listed under "<relative path>#<row>".
    valid = {str(r["id"]): r["text"] for r in rows if r["id"] not in ("", None)}
    assert "12345" in valid
    state = assert_embedded_once(out, valid)
    assert state.rejects == {"docs.jsonl#3": "malformed_record", "docs.jsonl#7": "malformed_record"}


# -- 7. a corpus rejected whole, and a field the corpus does not have ----------------------------


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("text_field", "says"), [
    pytest.param("body", "no field 'body' in the first 30 records (fields seen: id, text, title)", id="missing"),
    pytest.param("title", "field 'title' holds no text in the first 30 records", id="empty-everywhere"),
])
def test_a_text_field_the_corpus_cannot_fill_stops_before_any_server(
        text_field: str, says: str, tmp_path: Path, ray_address: str) -> None:
    write_jsonl(tmp_path / "c" / "docs.jsonl", [{**row, "title": " "} for row in documents(30)])
    with StandIn(dimension=DIMENSION) as server:
        job = write_job(tmp_path / "job.yaml", {"path": str(tmp_path / "c"), "text_field": text_field},
                        static(server), tmp_path / "out")
        refused = run(job, ray_address)
        seen = server.stats().requests
    assert refused.code == 2, refused.output
    assert says in refused.stderr and "docs.jsonl" in refused.stderr, refused.stderr
    assert seen == {}, "no server was asked anything"
    assert not list((tmp_path / "out").rglob("*.parquet"))


@pytest.mark.timeout(180)
def test_every_document_rejected_is_an_error_and_the_corrected_job_reuses_the_output(
        tmp_path: Path, ray_address: str) -> None:
    # Passes the corpus probe (the field holds text), yet every text is too long for the servers.
    rows: list[dict[str, Any]] = [
        {"id": f"d{i:03d}", "text": f"long body {i} " + "word " * 300, "summary": f"summary {i}"} for i in range(30)]
    write_jsonl(tmp_path / "c" / "docs.jsonl", rows)
    out = tmp_path / "out"
    with StandIn(dimension=DIMENSION, info={"max_input_length": 4}) as server:
        corpus = {"path": str(tmp_path / "c")}
        job = write_job(tmp_path / "job.yaml", corpus, static(server), out, model={"id": MODEL, "truncate": False})
        refused = run(job, ray_address)
        assert refused.code == 2, refused.output
        assert "every one of the 30 documents read was rejected (input_too_long: 30)" in refused.stderr
        state = ended(out)
        assert state.vector_rows == 0 and len(state.rejects) == 30
        assert set(state.rejects.values()) == {"input_too_long"}

        job = write_job(tmp_path / "job.yaml", {**corpus, "text_field": "summary"}, static(server), out,
                        model={"id": MODEL, "truncate": False})
        fixed = run(job, ray_address)
    assert fixed.code == 0, fixed.output
    state = assert_embedded_once(out, {r["id"]: r["summary"] for r in rows})
    assert state.rejects == {}, "the first job's rejects are gone with its options"
