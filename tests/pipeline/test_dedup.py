"""Identical texts are sent once and written for every id; moved texts keep their vectors; the switch."""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pytest
import ray
import yaml

from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.dedup import Dedup, DedupRegistry, ShardCopies, hash_key
from teibatch.pipeline.opening import run_dedup
from teibatch.pipeline.unique_ids import IdIndex
from teibatch.server import text_digest
from teibatch.tei.packing import PROBE_TEXT
from tests.conftest import write_jsonl
from tests.pipeline.test_crash_resume import crash_and_resume, output_rows, run, write_job
from tests.pipeline.test_incremental import received, recording

__all__ = ["recording"]  # the fixture, shared with the incremental tests

DOCUMENTS = 100
DISTINCT = 70
PER_FILE = 25
SHARD_DOCS = 10


def duplicated_corpus(root: Path) -> dict[str, list[dict[str, str]]]:
    """100 documents in 4 files (shards of 10), 30 of them repeating the text of another: in its own
    shard (the one before it), in another shard of its file, in other files."""
    distinct = (f"distinct text number {n} on topic {n % 9}" for n in range(DOCUMENTS))
    files: dict[str, list[dict[str, str]]] = {}
    for f in range(DOCUMENTS // PER_FILE):
        rows = files[f"f{f}.jsonl"] = []
        for i in range(PER_FILE):
            if i in (5, 15):
                text = rows[i - 1]["text"]
            elif f == 0 and i == 20:
                text = rows[1]["text"]
            elif f > 0 and i in (3, 8, 12, 18, 21, 23):
                text = files[f"f{f - 1}.jsonl"][i]["text"]
            elif f > 0 and i == 24:
                text = files["f0.jsonl"][0]["text"]
            else:
                text = next(distinct)
            rows.append({"id": f"{f}-{i}", "text": text})
        write_jsonl(root / f"f{f}.jsonl", rows)
    assert len({row["text"] for rows in files.values() for row in rows}) == DISTINCT
    return files


def repeats(files: dict[str, list[dict[str, str]]]) -> tuple[int, int]:
    """Repeated texts whose first copy is in the same shard, and in another shard."""
    first: dict[str, tuple[str, int]] = {}
    same = other = 0
    for name, rows in files.items():
        for i, row in enumerate(rows):
            shard = (name, i // SHARD_DOCS)
            if row["text"] not in first:
                first[row["text"]] = shard
            elif first[row["text"]] == shard:
                same += 1
            else:
                other += 1
    return same, other


def sent_since(endpoint: Endpoint, before: dict[str, int]) -> dict[str, int]:
    """What the server embedded since ``before``, the probe request left out."""
    after = received(endpoint)
    sent = {digest: after[digest] - before.get(digest, 0) for digest in after if after[digest] != before.get(digest)}
    sent.pop(text_digest(PROBE_TEXT), None)
    return sent


def vectors_table(out: Path) -> pa.Table:
    return ds.dataset(out / "vectors").to_table().sort_by("id")


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("id_field", [pytest.param("id", id="ids"), pytest.param(None, id="places-as-ids")])
def test_repeated_texts_are_sent_once_and_written_for_every_id(
        tmp_path: Path, job_file: Callable[..., Path], recording: tuple[Endpoint, dict[str, object]],
        id_field: str | None) -> None:
    files = duplicated_corpus(tmp_path / "corpus")
    same_shard, other_shard = repeats(files)
    assert same_shard >= 3 and other_shard >= 10, "repeats within a shard and across shards"
    endpoint, servers = recording
    before = received(endpoint)
    corpus = {"path": str(tmp_path / "corpus"), "id_field": id_field, "shard_docs": SHARD_DOCS}
    summary = run_job(load_job(job_file(corpus, servers)))
    sent = sent_since(endpoint, before)
    assert sum(sent.values()) == DISTINCT and set(sent.values()) == {1}  # 70% of the texts, each once
    report = summary.to_json()["documents"]
    assert (report["embedded"], report["deduplicated"]) == (DOCUMENTS, DOCUMENTS - DISTINCT)
    (index,) = (tmp_path / "out" / "_ids").iterdir()  # the texts other shards hold were listed: only those are claimed
    assert orjson.loads((index / "index.json").read_bytes())["shared"]

    before = received(endpoint)
    plain = run_job(load_job(job_file({**corpus, "deduplicate": False}, servers,
                                      output={"path": str(tmp_path / "plain")})))
    assert sum(sent_since(endpoint, before).values()) == DOCUMENTS and plain.deduplicated == 0
    deduplicated, every_copy = vectors_table(tmp_path / "out"), vectors_table(tmp_path / "plain")
    assert deduplicated.num_rows == DOCUMENTS
    assert deduplicated.equals(every_copy)  # ids, hashes, vectors bit for bit, row for row


@pytest.mark.usefixtures("ray_session")
def test_texts_repeated_only_within_their_shards_are_sent_once_with_no_registry(
        tmp_path: Path, job_file: Callable[..., Path], recording: tuple[Endpoint, dict[str, object]]) -> None:
    """No text is in two shards: the id index says so, no registry starts (``run_dedup``), and each
    shard still sends a text it holds twice once."""
    rows = [{"id": f"d{i}", "text": f"shard {i // SHARD_DOCS} text {i % SHARD_DOCS % 7}"} for i in range(40)]
    write_jsonl(tmp_path / "corpus" / "f.jsonl", rows)
    distinct = len({row["text"] for row in rows})
    assert distinct == 28
    endpoint, servers = recording
    before = received(endpoint)
    summary = run_job(load_job(job_file({"path": str(tmp_path / "corpus"), "id_field": "id",
                                         "shard_docs": SHARD_DOCS}, servers)))
    sent = sent_since(endpoint, before)
    assert sum(sent.values()) == distinct and set(sent.values()) == {1}
    report = summary.to_json()["documents"]
    assert (report["embedded"], report["deduplicated"]) == (40, 40 - distinct)
    (index,) = (tmp_path / "out" / "_ids").iterdir()
    assert orjson.loads((index / "index.json").read_bytes())["shared"] == {}
    table = vectors_table(tmp_path / "out")
    by_text = {}
    for doc_id, vector in zip(table["id"].to_pylist(), table["embedding"].to_pylist(), strict=True):
        by_text.setdefault(rows[int(doc_id[1:])]["text"], []).append(vector)
    assert all(all(v == vectors[0] for v in vectors) for vectors in by_text.values())


def test_the_run_starts_a_registry_only_where_some_text_is_in_two_shards(
        tmp_path: Path, job_file: Callable[..., Path], ray_session: None) -> None:
    servers = {"provider": "static", "urls": ["http://127.0.0.1:9"]}
    plain = load_job(job_file({"path": str(tmp_path), "deduplicate": False}, servers))
    job = load_job(job_file({"path": str(tmp_path)}, servers))
    apart = IdIndex(str(tmp_path), "_ids/x", {}, texts=True)
    assert run_dedup(job, apart) == Dedup.within_shards()
    assert run_dedup(plain, apart) is None
    # One shard to embed: no other shard of the run can hold its texts, whatever the index says.
    assert run_dedup(job, None, pending=1) == Dedup.within_shards()
    assert run_dedup(plain, None, pending=1) is None
    for ids in (None, dataclasses.replace(apart, shared={"s": (0, (1,))}), dataclasses.replace(apart, texts=False)):
        dedup = run_dedup(job, ids)
        assert dedup is not None and dedup.registry is not None
        try:
            assert ray.get(dedup.registry.release.remote([]), timeout=60) is None  # up and answering
        finally:
            ray.kill(dedup.registry, no_restart=True)


@pytest.mark.usefixtures("ray_session")
def test_chunks_with_the_same_text_are_sent_once(tmp_path: Path, job_file: Callable[..., Path],
                                                 recording: tuple[Endpoint, dict[str, object]]) -> None:
    footer = "Shared footer text, all rights reserved, write to us for more."
    rows = [{"id": f"d{i}", "text": f"Opening paragraph {i} talks about its own subject at some length, word after "
                                    f"word after word.\n\n{footer}"} for i in range(12)]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", rows)
    endpoint, servers = recording
    corpus = {"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 4}
    chunking = {"strategy": "paragraphs", "max_tokens": 24}
    summary = run_job(load_job(job_file(corpus, servers, chunking=chunking)))
    chunks = vectors_table(tmp_path / "out")
    distinct = len(set(chunks.column("content_hash").to_pylist()))
    assert distinct <= chunks.num_rows - 11  # the footer's chunk, in each of the 12 documents
    assert sum(sent_since(endpoint, {}).values()) == distinct  # each chunk text once
    assert summary.to_json()["chunking"]["chunks_deduplicated"] == chunks.num_rows - distinct
    plain = run_job(load_job(job_file({**corpus, "deduplicate": False}, servers, chunking=chunking,
                                      output={"path": str(tmp_path / "plain")})))
    assert plain.to_json()["chunking"]["chunks_deduplicated"] == 0
    assert vectors_table(tmp_path / "out").equals(vectors_table(tmp_path / "plain"))


@pytest.mark.usefixtures("ray_session")
def test_incremental_run_sends_nothing_for_a_text_that_moved(
        tmp_path: Path, job_file: Callable[..., Path], recording: tuple[Endpoint, dict[str, object]]) -> None:
    root = tmp_path / "corpus"
    a = [{"id": f"a-{i}", "text": f"text {i} first kept in file a"} for i in range(8)]
    b = [{"id": f"b-{i}", "text": f"text {i} first kept in file b"} for i in range(8)]
    write_jsonl(root / "a.jsonl", a)
    write_jsonl(root / "b.jsonl", b)
    endpoint, servers = recording
    corpus = {"path": str(root), "id_field": "id", "shard_docs": SHARD_DOCS}
    run_job(load_job(job_file(corpus, servers, mode="incremental")))

    moved = a.pop(2)  # to another file, same id
    b.append(moved)
    write_jsonl(root / "a.jsonl", a)
    write_jsonl(root / "b.jsonl", b)
    write_jsonl(root / "c.jsonl", [{"id": "renamed", "text": a[0]["text"]},  # a new id for a kept text
                                   {"id": "new", "text": "a text never seen"}])
    before = received(endpoint)
    second = run_job(load_job(job_file(corpus, servers, mode="incremental")))
    assert sent_since(endpoint, before) == {text_digest("a text never seen"): 1}
    assert second.reused == len(a) + len(b) + 1 and second.embedded == 1

    fresh = run_job(load_job(job_file(corpus, servers, output={"path": str(tmp_path / "fresh")})))
    assert fresh.embedded == len(a) + len(b) + 2
    assert vectors_table(tmp_path / "out").equals(vectors_table(tmp_path / "fresh"))


@pytest.mark.parametrize(("point", "driver_dies"), [
    pytest.param("commit:3", True, id="driver-after-3-commits"),
    pytest.param("shard-write:2", False, id="worker-between-its-parts"),
])
def test_killed_deduplicating_run_resumes_to_the_same_output(point: str, driver_dies: bool, ray_address: str,
                                                             tmp_path: Path) -> None:
    duplicated_corpus(tmp_path / "corpus")
    corpus = {"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": SHARD_DOCS}
    plain, out = tmp_path / "plain", tmp_path / "out"
    done = run(crash_job(tmp_path, plain, {**corpus, "deduplicate": False}), ray_address)
    assert done.returncode == 0, done.stderr
    crash_and_resume(crash_job(tmp_path, out, corpus), ray_address, point, driver_dies, tmp_path)
    vectors, _ = output_rows(out)
    assert vectors.num_rows == DOCUMENTS
    assert vectors.equals(output_rows(plain)[0])


def crash_job(tmp_path: Path, out: Path, corpus: dict[str, object]) -> Path:
    """The crash tests' job (``tests/pipeline/test_crash_resume.py``) over ``corpus``."""
    path = write_job(tmp_path, tmp_path / "corpus", out)
    spec = yaml.safe_load(path.read_text())
    path.write_text(yaml.safe_dump({**spec, "corpus": corpus}))
    return path


@pytest.fixture
def ray_address(ray_session: None) -> str:
    import ray

    return str(ray.get_runtime_context().gcs_address)


KEYS = [hash_key(f"{n:032x}") for n in range(4)]


def test_registry_first_claim_sends_and_the_others_take_its_vector() -> None:
    async def scenario() -> None:
        registry = DedupRegistry()
        assert (await registry.claim("s1", KEYS[:2])).mine == [True, True]
        assert (await registry.claim("s2", KEYS[1:3])).mine == [False, True]
        claimed = await registry.claim("s1", KEYS[:1])  # a task run again keeps its claims
        assert claimed.mine == [True] and claimed.deliver == [KEYS[1]]  # and learns s2 waits for KEYS[1]
        waiting = asyncio.create_task(registry.take("s2", [KEYS[1]], timeout=30))
        await registry.publish("s1", KEYS[:2], np.ones((2, 3), dtype=np.float32), [False, True])
        taken = await asyncio.wait_for(waiting, 5)
        assert taken.found == [0] and taken.gone == [] and taken.truncated == [True]
        np.testing.assert_array_equal(taken.vectors, np.ones((1, 3), dtype=np.float32))
        assert (await registry.claim("s3", KEYS[:1])).mine == [False]  # published: a later shard copies it

    asyncio.run(scenario())


@pytest.mark.parametrize("how", [pytest.param("release", id="owner-ended"),
                                 pytest.param("abandon", id="servers-refused-the-text")])
def test_registry_never_leaves_a_waiter_stuck(how: str) -> None:
    async def scenario() -> None:
        registry = DedupRegistry()
        await registry.claim("owner", KEYS[:1])
        assert (await registry.claim("waiter", KEYS[:1])).mine == [False]
        waiting = asyncio.create_task(registry.take("waiter", KEYS[:1], timeout=300))
        await asyncio.sleep(0)
        if how == "release":
            await registry.release(["owner"])
        else:
            await registry.abandon("owner", KEYS[:1])
        taken = await asyncio.wait_for(waiting, 5)  # at once, not after the bound
        assert taken.gone == [0] and taken.found == []  # the waiter sends it itself
        assert (await registry.claim("other", KEYS[:1])).mine == [True]

    asyncio.run(scenario())


def test_registry_wait_is_bounded() -> None:
    async def scenario() -> None:
        registry = DedupRegistry()
        await registry.claim("silent", KEYS[:1])
        started = time.monotonic()
        taken = await registry.take("waiter", KEYS[:1], timeout=0.2)
        assert taken.found == taken.gone == [] and time.monotonic() - started < 5

    asyncio.run(scenario())


def test_registry_forgets_the_oldest_vectors_beyond_its_bound() -> None:
    async def scenario() -> None:
        registry = DedupRegistry(keep_bytes=2 * 3 * 4)  # two vectors of 3 floats
        await registry.claim("s1", KEYS[:3])
        await registry.publish("s1", KEYS[:3], np.zeros((3, 3), dtype=np.float32), [False] * 3)
        assert registry.stats() == {"texts": 2, "vector_bytes": 24, "published_bytes": 36, "objects_read": 0}
        assert (await registry.claim("s2", KEYS[:3])).mine == [True, False, False]  # the oldest is sent again

    asyncio.run(scenario())


def test_shard_copies_within_a_shard_without_a_registry() -> None:
    hashes = ["h0", "h1", "h0", "h2", "h1", "h0"]
    copies = ShardCopies("s", hashes)
    sent = list(copies.decide([(u, f"text {h}") for u, h in enumerate(hashes)]))
    assert [u for u, _ in sent] == [0, 1, 3]
    assert not copies.final_through(2)
    vectors = np.arange(9, dtype=np.float32).reshape(3, 3)
    copies.landed([0, 1, 3], vectors, np.array([True, False, True]), np.zeros(3, dtype=bool), refused=[1])
    assert copies.final_through(5)
    assert sorted(copies.copies) == [2, 5] and copies.refused == {4: 1}  # a copy of a refused text is refused
    np.testing.assert_array_equal(copies.copies[5][1], vectors[0])
