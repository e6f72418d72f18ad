"""Small shards travel together: one Ray task holds enough documents to fill the servers, each shard
still commits or fails on its own."""

from __future__ import annotations

import gc
import gzip
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import pytest
import yaml

from teibatch.corpus import Shard, plan_shards
from teibatch.crashpoints import CRASH_AT
from teibatch.endpoint import Endpoint
from teibatch.errors import CorpusMismatch
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.cycles import no_cycle_collection
from teibatch.pipeline.run import MAX_SHARDS_PER_TASK, _tasks
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan
from teibatch.tei import ClientLimits, EmbedOptions
from tests.conftest import write_jsonl


def shards(*sizes: int) -> list[Shard]:
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    return [Shard(f"s{i}", ("a.jsonl",), start, start + size, "jsonl")
            for i, (start, size) in enumerate(zip(starts, sizes, strict=True))]


def sender(budget: int) -> SenderRef:
    limits = ClientLimits(max_batch_size=4, max_inflight_inputs=budget, payload_limit=2_000_000)
    plan = SenderPlan((ServerPlan(Endpoint("http://127.0.0.1:1"), limits),), route="embed", embed=EmbedOptions(),
                      dimension=384)
    return SenderRef(actor=None, plan=plan)


def test_small_shards_are_grouped_until_a_task_holds_the_budget(job_file: Callable[..., Path], tmp_path: Path) -> None:
    job = load_job(job_file({"path": str(tmp_path)}))
    grouped = _tasks(job, [sender(300), sender(212)], shards(100, 100, 100, 100, 100, 100, 50, 600, 10))
    assert [[s.id for s in task] for task in grouped] == [
        ["s0", "s1", "s2", "s3", "s4", "s5"],  # 600 >= 512: the senders' whole budget
        ["s6", "s7"],  # a large shard closes the group it joins
        ["s8"],  # the rest, however small
    ]
    assert [len(task) for task in _tasks(job, [sender(10**6)], shards(*[1] * 40))] == [MAX_SHARDS_PER_TASK,
                                                                                         MAX_SHARDS_PER_TASK, 8]
    # Shards as large as the budget, or a job that sets how many shards run at once: one shard a task.
    assert [len(task) for task in _tasks(job, [sender(512)], shards(512, 600, 700))] == [1, 1, 1]
    explicit = job.model_copy(update={"limits": job.limits.model_copy(update={"max_shards_in_flight": 3})})
    assert [len(task) for task in _tasks(explicit, [sender(512)], shards(10, 10, 10))] == [1, 1, 1]


def _gzip_jsonl(path: Path, prefix: str, count: int) -> bytes:
    lines = b"".join(orjson.dumps({"id": f"{prefix}{i}", "text": f"{prefix} document {i}"}) + b"\n"
                     for i in range(count))
    data = gzip.compress(lines)
    path.write_bytes(data)
    return data


@pytest.mark.slow  # run_job starts a private Ray
@pytest.mark.timeout(300)
def test_a_bad_shard_fails_alone_inside_its_task(tmp_path: Path, job_file: Callable[..., Path]) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    _gzip_jsonl(corpus / "a.jsonl.gz", "a", 250)
    good_b = _gzip_jsonl(corpus / "b.jsonl.gz", "b", 3000)
    _gzip_jsonl(corpus / "c.jsonl.gz", "c", 250)
    (corpus / "b.jsonl.gz").write_bytes(good_b[: len(good_b) // 2])  # cut off mid-stream
    job = load_job(job_file({"path": str(corpus), "id_field": "id", "shard_docs": 100},
                            {"provider": "local", "count": 1}))
    planned = plan_shards(job.corpus_options())
    # One built-in server admits 512 inputs at once: good and bad shards share tasks.
    mixed = [task for task in _tasks(job, [sender(512)], planned) if len({s.sources for s in task}) > 1]
    assert any("b.jsonl.gz" in {src for s in task for src in s.sources} for task in mixed)

    with pytest.raises(CorpusMismatch, match=r"b\.jsonl\.gz"):
        run_job(job)
    out = tmp_path / "out"
    ids = ds.dataset(out / "vectors").to_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted([f"a{i}" for i in range(250)] + [f"c{i}" for i in range(250)])

    (corpus / "b.jsonl.gz").write_bytes(good_b)  # fixed: the same command finishes the job
    summary = run_job(job)
    assert summary.status == "done"
    ids = ds.dataset(out / "vectors").to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 3500


def test_chunked_shards_are_grouped_by_the_chunks_they_send(job_file: Callable[..., Path], tmp_path: Path) -> None:
    job = load_job(job_file({"path": str(tmp_path)}))
    pending = shards(*[20] * 6)
    assert [len(task) for task in _tasks(job, [sender(512)], pending)] == [6]  # 120 documents < 512
    assert [len(task) for task in _tasks(job, [sender(512)], pending, per_document=30.0)] == [1] * 6
    assert [len(task) for task in _tasks(job, [sender(512)], pending, per_document=13.0)] == [2, 2, 2]


def long_documents(root: Path) -> None:
    """6 files of 20 documents of about 300 words: 20 or so chunks each at max_tokens 24."""
    for f in range(6):
        write_jsonl(root / f"f{f}.jsonl", [
            {"id": f"{f}-{i}", "text": ". ".join(" ".join(f"w{(f * 31 + i * 7 + j) % 97}" for j in range(k, k + 12))
                                                 for k in range(0, 300, 12)) + "."}
            for i in range(20)])


@pytest.mark.slow  # real Ray, two built-in servers, a run killed and run again
@pytest.mark.timeout(600)
def test_a_killed_chunked_run_had_committed_part_of_the_corpus(tmp_path: Path, ray_session: None) -> None:
    import ray

    corpus = tmp_path / "corpus"
    long_documents(corpus)
    out = tmp_path / "out"
    spec = {"name": "chunked-tasks", "corpus": {"path": str(corpus), "id_field": "id", "shard_docs": 20},
            "servers": {"provider": "local", "count": 1}, "output": {"path": str(out)},
            "chunking": {"strategy": "sentences", "max_tokens": 24, "overlap_tokens": 4}}
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(spec))
    shard_count = len(plan_shards(load_job(job).corpus_options()))
    assert shard_count == 6
    command = [sys.executable, "-m", "teibatch", "run", str(job), "-q", "--ray-address",
               ray.get_runtime_context().gcs_address]
    # Killed right after its first commit: with one task for all six shards (120 documents, under the
    # server's 512 inputs, but about 2,200 chunks) every shard was sent before anything was committed.
    crashed = subprocess.run(command, env={**os.environ, CRASH_AT: "commit:1"}, capture_output=True, text=True,
                             timeout=300, check=False)
    assert crashed.returncode == -signal.SIGKILL, crashed.stderr
    committed = orjson.loads((out / "_manifest.json").read_bytes())["shards"]
    sent = list((out / "vectors").glob("part-*.parquet"))  # committed or not: what the servers embedded
    assert len(committed) == 1
    assert len(sent) < shard_count  # the work was cut into tasks that commit as they end
    resumed = subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)
    assert resumed.returncode == 0, resumed.stderr
    reports = [orjson.loads(path.read_bytes()) for path in (out / "runs").glob("*.json")]
    assert [r["shards"]["skipped_committed"] for r in reports] == [1]  # the killed run wrote none
    ids = ds.dataset(out / "vectors").to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) > 120 * 10


@pytest.mark.parametrize("enabled_before", [True, False])
def test_a_shard_task_runs_without_the_cycle_collector_and_puts_it_back(enabled_before: bool) -> None:
    was = gc.isenabled()
    try:
        (gc.enable if enabled_before else gc.disable)()
        with pytest.raises(RuntimeError), no_cycle_collection():
            assert not gc.isenabled()
            raise RuntimeError("a shard failed")
        assert gc.isenabled() is enabled_before
    finally:
        (gc.enable if was else gc.disable)()
