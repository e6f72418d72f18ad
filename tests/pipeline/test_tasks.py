"""Small shards travel together: one Ray task holds enough documents to fill the servers, each shard
still commits or fails on its own."""

from __future__ import annotations

import gzip
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import pytest

from teibatch.corpus import Shard, plan_shards
from teibatch.endpoint import Endpoint
from teibatch.errors import CorpusMismatch
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.run import MAX_SHARDS_PER_TASK, _tasks
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan
from teibatch.tei import ClientLimits, EmbedOptions


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
