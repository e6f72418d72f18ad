"""Every id at most once in an output, across shards and files: later records are duplicate_id rejects."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import ray
from click.testing import CliRunner

from teibatch.cli import main
from teibatch.corpus import CorpusOptions, plan_shards
from teibatch.errors import EXIT_REFUSED
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.progress import SilentReporter
from teibatch.pipeline.run import IndexReporting
from teibatch.pipeline.unique_ids import IdIndex, IndexProgress, build_id_index, stored_id_index
from teibatch.sink import OutputStore
from tests.conftest import write_jsonl
from tests.pipeline.test_crash_resume import crash_and_resume

pytestmark = pytest.mark.usefixtures("ray_session")

ONE_SERVER = {"provider": "local", "count": 1}


def issue_corpus(root: Path) -> None:
    """The issue's corpus: a.jsonl d0–d99, b.jsonl d95–d104, c.jsonl c0–c59 twice (230 rows, 165 ids)."""
    write_jsonl(root / "a.jsonl", [{"id": f"d{i}", "text": f"alpha {i}"} for i in range(100)])
    write_jsonl(root / "b.jsonl", [{"id": f"d{i}", "text": f"beta {i}"} for i in range(95, 105)])
    write_jsonl(root / "c.jsonl", [{"id": f"c{i % 60}", "text": f"gamma {i}"} for i in range(120)])


def output_ids(out: Path) -> list[str]:
    return ds.dataset(out / "vectors").to_table(columns=["id"]).column("id").to_pylist()


def rejects(out: Path) -> list[tuple[str, str, str]]:
    table = ds.dataset(out / "rejects").to_table()
    return sorted(zip(table.column("id").to_pylist(), table.column("reason").to_pylist(),
                      table.column("detail").to_pylist(), strict=True))


@pytest.mark.parametrize("partition_rows", [
    pytest.param(None, id="one-partition"),
    pytest.param(7, id="many-partitions"),  # the ids of 230 rows spread over 33 partitions
])
def test_ids_repeated_across_files_and_shards_are_rejected_on_every_run(
        tmp_path: Path, job_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch,
        partition_rows: int | None) -> None:
    if partition_rows is not None:
        monkeypatch.setattr("teibatch.sink.id_repeats.PARTITION_ROWS", partition_rows)
        monkeypatch.setattr("teibatch.pipeline.unique_ids.SPILL_BATCH_DOCS", 60)  # and spilled a few shards at a time
    issue_corpus(tmp_path / "corpus")
    job = load_job(job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 50}, ONE_SERVER))
    out = tmp_path / "out"
    summary = run_job(job)

    ids = output_ids(out)
    assert len(ids) == len(set(ids)) == 165
    first = rejects(out)
    assert len(first) == 65 and {reason for _, reason, _ in first} == {"duplicate_id"}
    assert summary.rejected_total == 65 and summary.rejected["duplicate_id"] == 65
    details = {(doc_id, detail.split(":")[0]): detail for doc_id, _, detail in first}
    # Across files: the later file's record names both places; the first occurrence keeps the id.
    assert details["d95", "b.jsonl#0 (line 1)"].endswith("was already seen (a.jsonl#95 (line 96))")
    # One file over several shards: the second copy of c0 (row 60, shard 2) names line 1.
    assert details["c0", "c.jsonl#60 (line 61)"].endswith("(line 61) was already seen (line 1)")
    assert {doc_id for doc_id, _, _ in first} == {f"d{i}" for i in range(95, 100)} | {f"c{i}" for i in range(60)}
    kept = ds.dataset(out / "vectors").to_table(columns=["id", "content_hash"]).to_pylist()
    by_id = {row["id"]: row["content_hash"] for row in kept}
    report = orjson.loads((out / "runs" / f"{summary.run_id}.json").read_bytes())
    assert report["documents"]["rejected"] == 65
    # The reading is told as it starts and once built, with what the index found (all 65 are across shards).
    told = {event["event"]: event for event in report["events"]}
    assert told["id_index_started"]["documents"] == 230 and told["id_index_started"]["shards"] == 6
    assert told["id_index_built"]["duplicates"] == 65
    assert "65 record(s) repeat an id an earlier shard holds" in told["id_index_built"]["message"]
    (index,) = (out / "_ids").iterdir()
    assert sorted(p.name for p in index.iterdir()) == ["index.json", "losers"]  # the spill is gone

    # A rerun into a fresh output decides the same.
    shutil.rmtree(out)
    run_job(job)
    assert rejects(out) == first
    assert {row["id"]: row["content_hash"] for row in
            ds.dataset(out / "vectors").to_table(columns=["id", "content_hash"]).to_pylist()} == by_id

    # A resumed run: the shard that keeps d95–d99 and the one that repeats them are not committed.
    manifest = orjson.loads((out / "_manifest.json").read_bytes())
    dropped = [sid for sid, entry in manifest["shards"].items() if entry["sources"] == ["b.jsonl"]]
    dropped.append(manifest["planned"][1])  # a.jsonl rows 50–99
    assert len(dropped) == 2
    for shard_id in dropped:
        del manifest["shards"][shard_id]
        for folder in ("vectors", "rejects"):
            (out / folder / f"part-{shard_id}.parquet").unlink()
    (out / "_manifest.json").write_bytes(orjson.dumps(manifest))
    built = (index / "index.json").stat().st_mtime_ns
    resumed = run_job(job)
    assert resumed.shards_committed == 2
    assert (index / "index.json").stat().st_mtime_ns == built  # the same plan: its index is read, not built
    assert not [e for e in resumed.events if e["event"].startswith("id_index")]
    ids = output_ids(out)
    assert len(ids) == len(set(ids)) == 165
    assert rejects(out) == first


def test_validate_finds_an_id_written_twice(tmp_path: Path, job_file: Callable[..., Path]) -> None:
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "a.jsonl", [{"id": f"a{i}", "text": f"alpha {i}"} for i in range(10)])
    write_jsonl(corpus / "b.jsonl", [{"id": f"b{i}", "text": f"beta {i}"} for i in range(10)])
    path = job_file({"path": str(corpus), "id_field": "id"}, ONE_SERVER)
    run_job(load_job(path))
    runner = CliRunner()
    clean = runner.invoke(main, ["validate", str(path)])
    assert clean.exit_code == 0, clean.output

    # By hand: b's part gets a copy of a's first row.
    parts = sorted((tmp_path / "out" / "vectors").glob("part-*.parquet"))
    a_part, b_part = sorted(parts, key=lambda p: pq.read_table(p).column("id")[0].as_py())
    b_table = pq.read_table(b_part)
    pq.write_table(pa.concat_tables([b_table, pq.read_table(a_part).slice(0, 1).cast(b_table.schema)]), b_part)
    caught = runner.invoke(main, ["validate", str(path)])
    assert caught.exit_code == EXIT_REFUSED, caught.output
    assert "'a0' in vectors/" in caught.output and f"{a_part.name}#0 and vectors/{b_part.name}#10" in caught.output
    assert "2 vectors part(s), every id once" in clean.output


def test_a_new_earlier_file_takes_ids_from_committed_shards(tmp_path: Path, job_file: Callable[..., Path]) -> None:
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "a.jsonl", [{"id": f"d{i}", "text": f"alpha {i}"} for i in range(20)])
    write_jsonl(corpus / "b.jsonl", [{"id": f"e{i}", "text": f"beta {i}"} for i in range(20)])
    job = load_job(job_file({"path": str(corpus), "id_field": "id", "shard_docs": 10}, ONE_SERVER,
                            mode="incremental"))
    run_job(job)
    out = tmp_path / "out"
    assert len(output_ids(out)) == 40 and not rejects(out)

    # 0.jsonl comes first in plan order: it keeps d3 and e15, which committed shards of a and b held.
    write_jsonl(corpus / "0.jsonl", [{"id": "d3", "text": "zero 3"}, {"id": "e15", "text": "zero 15"}])
    summary = run_job(job)
    assert summary.shards_committed == 3  # 0.jsonl's, and the two shards that lose an id to it
    ids = output_ids(out)
    assert len(ids) == len(set(ids)) == 40
    assert [(doc_id, detail) for doc_id, _, detail in rejects(out)] == [
        ("d3", "a.jsonl#3 (line 4): id 'd3' (line 4) was already seen (0.jsonl#0 (line 1))"),
        ("e15", "b.jsonl#15 (line 16): id 'e15' (line 16) was already seen (0.jsonl#1 (line 2))")]
    assert run_job(job).shards_committed == 0  # decided: nothing to do


def test_a_run_killed_between_shards_resumes_with_every_id_once(tmp_path: Path,
                                                                job_file: Callable[..., Path]) -> None:
    issue_corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    job = job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 50}, ONE_SERVER,
                   limits={"max_shards_in_flight": 1})
    address = ray.get_runtime_context().gcs_address
    # The driver is killed after two of the five shards are committed (those of a.jsonl, which keep d95–d99).
    crash_and_resume(job, address, "commit:2", True, tmp_path)
    ids = output_ids(out)
    assert len(ids) == len(set(ids)) == 165
    found = rejects(out)
    assert len(found) == 65 and {reason for _, reason, _ in found} == {"duplicate_id"}
    assert {doc_id for doc_id, _, _ in found} == {f"d{i}" for i in range(95, 100)} | {f"c{i}" for i in range(60)}


@pytest.mark.parametrize("id_field", [pytest.param("id", id="ids"), pytest.param(None, id="places-as-ids")])
@pytest.mark.parametrize(("partition_rows", "batch_docs"), [pytest.param(None, None, id="one-partition"),
                                                           pytest.param(3, None, id="many-partitions"),
                                                           pytest.param(3, 5, id="spilled-in-batches")])
def test_the_index_lists_the_documents_whose_text_another_shard_holds(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, partition_rows: int | None, batch_docs: int | None,
        id_field: str | None) -> None:
    if partition_rows is not None:
        monkeypatch.setattr("teibatch.sink.id_repeats.PARTITION_ROWS", partition_rows)
    if batch_docs is not None:  # a spill task writes what it holds after each shard that brings it past 5
        monkeypatch.setattr("teibatch.pipeline.unique_ids.SPILL_BATCH_DOCS", batch_docs)
    # Shards of 4: "shared" is in shards 0 and 2, "twice" twice in shard 1 only; a bad row keeps its place.
    texts = ["a", "shared", "b", "c", "twice", "d", "twice", "e", "f", "g", "shared", "h"]
    rows: list[object] = [{"id": f"i{n}", "text": text} for n, text in enumerate(texts)]
    rows.insert(9, {"id": "no-text"})
    write_jsonl(tmp_path / "corpus" / "a.jsonl", rows)
    options = CorpusOptions(path=str(tmp_path / "corpus"), id_field=id_field, shard_docs=4)
    shards = plan_shards(options)
    store = OutputStore(str(tmp_path / "out"))
    index = build_id_index(store, {}, options, shards, texts=True)
    assert index is not None and index.texts
    assert [sorted(index.shared_texts(shard.id)) for shard in shards] == [[1], [], [3], []]
    assert index == stored_id_index(store, {}, shards, texts=True)  # as a resumed run reads it
    # Without dedup the texts are not read: rows without ids need no index at all.
    ids_only = build_id_index(store, {}, options, shards, texts=False)
    if id_field is None:
        assert ids_only is None
    else:
        assert ids_only is not None and not ids_only.texts and ids_only.shared == {}
        assert stored_id_index(store, {}, shards, texts=True) is None  # one index per output: the last built


class HeardReading(IndexProgress):
    def __init__(self) -> None:
        self.reading_args: tuple[int, int] | None = None
        self.read_so_far: list[int] = []

    def reading(self, documents: int, shards: int) -> None:
        self.reading_args = (documents, shards)

    def read(self, documents: int) -> None:
        self.read_so_far.append(documents)


def test_the_reading_of_the_ids_is_told_as_each_spill_task_ends(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    # Shards of 50, 50, 10, 50, 50 and 20 documents: a spill task each.
    monkeypatch.setattr("teibatch.pipeline.unique_ids.SPILL_TASK_DOCS", 50)
    issue_corpus(tmp_path / "corpus")
    options = CorpusOptions(path=str(tmp_path / "corpus"), id_field="id", shard_docs=50)
    heard = HeardReading()
    index = build_id_index(OutputStore(str(tmp_path / "out")), {}, options, plan_shards(options), texts=False,
                           progress=heard)
    assert heard.reading_args == (230, 6)
    assert len(heard.read_so_far) == 6 and heard.read_so_far == sorted(heard.read_so_far)
    assert heard.read_so_far[-1] == 230
    assert index is not None and index.losing_documents == 65


class Told(SilentReporter):
    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, object]]] = []

    def message(self, text: str, *, event: str = "message", **fields: object) -> None:
        self.events.append((event, fields))


def test_a_long_reading_says_how_far_it_got_between_its_start_and_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("teibatch.pipeline.run.INDEX_PROGRESS_S", 0.0)  # every spill task's end is due
    told = Told()
    reporting = IndexReporting(told)
    reporting.reading(1000, 4)
    for documents in (250, 500, 1000):
        reporting.read(documents)
    assert [event for event, _ in told.events] == ["id_index_started", "id_index_progress", "id_index_progress"]
    assert told.events[0][1] == {"documents": 1000, "shards": 4}
    assert told.events[2][1] == {"documents_read": 500, "documents_total": 1000}  # the end is told once built
    monkeypatch.setattr("teibatch.pipeline.run.INDEX_PROGRESS_S", 3600.0)
    quiet = Told()
    reporting = IndexReporting(quiet)
    reporting.reading(1000, 4)
    reporting.read(500)
    assert [event for event, _ in quiet.events] == ["id_index_started"]  # not due yet
    unread = Told()
    IndexReporting(unread).built(IdIndex("out", "_ids/x", {}))  # an index the output held: nothing was read
    assert unread.events == []
