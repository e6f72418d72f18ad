"""Progress lines: an ETA only once the rate is measured from real progress."""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest
import ray

from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.landed import LandedDocuments, LandedPoll
from teibatch.pipeline.progress import ETA_MIN_SPAN_S, Eta, InShardProgress, JsonLinesReporter, LineReporter
from tests.conftest import write_jsonl


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_shard_start_up_never_makes_an_eta() -> None:
    # 7 shards of 100: the first finishes after 59 s of start-up, the other six within 3 s of it.
    clock, out = Clock(), io.StringIO()
    lines = LineReporter(out, interval=0, clock=clock)
    lines.start(7, 700)
    for at in (59.0, 59.5, 60.0, 60.5, 61.0, 61.5, 62.0):
        clock.now = at
        lines.advance(1, 100)
    shown = out.getvalue().splitlines()
    assert len(shown) == 8
    assert shown[1].endswith("shards 1/7, documents 100/700, 2 docs/s")
    assert not any("ETA" in line for line in shown)


def test_the_eta_comes_from_the_rate_after_the_first_shard() -> None:
    clock, out = Clock(), io.StringIO()
    lines = LineReporter(out, interval=0, clock=clock)
    lines.start(10, 1000)
    for at in (59.0, 60.0, 59.0 + ETA_MIN_SPAN_S, 69.0):
        clock.now = at
        lines.advance(1, 100)
    shown = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    assert shown[1:] == [
        "shards 1/10, documents 100/1,000, 2 docs/s",
        "shards 2/10, documents 200/1,000, 3 docs/s",               # 1 s of real progress: not yet
        "shards 3/10, documents 300/1,000, 5 docs/s, ETA 18s",      # 200 documents in 5 s, 700 left
        "shards 4/10, documents 400/1,000, 6 docs/s, ETA 20s",      # 300 in 10 s, 600 left
    ]


@pytest.mark.parametrize(("calls", "expected"), [
    pytest.param([(0, 10.0)], None, id="nothing-done"),
    pytest.param([(100, 10.0), (100, 30.0)], None, id="no-progress-since-the-first"),
    pytest.param([(100, 10.0), (1000, 30.0)], None, id="all-done"),
    pytest.param([(100, 10.0), (200, 12.0), (300, 20.0)], 35.0, id="measured"),
])
def test_eta_rule(calls: list[tuple[int, float]], expected: float | None) -> None:
    eta = Eta()
    left = [eta.seconds_left(done, 1000, now) for done, now in calls]
    assert left[-1] == expected


@pytest.mark.usefixtures("ray_session")
def test_documents_count_as_their_vectors_land_inside_a_running_shard(
        tmp_path: Path, job_file: Callable[..., Path], tei_servers: Callable[..., list[Endpoint]],
        monkeypatch: pytest.MonkeyPatch) -> None:
    rows = [{"id": f"d{i}", "text": f"document number {i}"} for i in range(6_000)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows)
    # A slow server: one simulated batch at a time, each at least 2 ms plus the server's own batching, so
    # the shard takes seconds (about 8 here) and lands in many steps, whatever the machine's load.
    endpoints = tei_servers(1, "--max-client-batch-size", "16", "--max-batch-requests", "1",
                            "--simulate-gpu", "1000000", "--batch-overhead-s", "0.002")
    monkeypatch.setenv("SLOW_KEY", endpoints[0].api_key or "")
    path = job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 10_000},
                    {"provider": "static", "urls": [e.url for e in endpoints], "api_key_env": "SLOW_KEY"},
                    client={"max_inflight_inputs": 8})
    stream = io.StringIO()
    run_job(load_job(path), reporter=JsonLinesReporter(stream))
    events = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    names = [event["event"] for event in events]
    assert names.count("shard_finished") == 1
    during = [event for event in events[:names.index("shard_finished")] if event["event"] == "progress"]
    assert during and all(0 < event["documents_done"] < len(rows) for event in during)
    assert [event["documents_done"] for event in during] == sorted(event["documents_done"] for event in during)
    finished = events[names.index("shard_finished")]
    assert (finished["documents_done"], finished["documents_total"], finished["status"]) == (6_000, 6_000, "committed")


def test_documents_counted_inside_a_shard_are_not_counted_again_when_it_ends() -> None:
    stream = io.StringIO()
    progress = InShardProgress(JsonLinesReporter(stream))
    progress.start(2, 150)
    progress.started("a", 100)
    progress.landed({"a": 40, "b": 5})  # b's task is not running yet: not counted
    progress.landed({"a": 20})
    progress.advance(1, 100, shard="a", status="committed")
    progress.started("b", 50)
    progress.landed({"b": 30})
    progress.landed({"b": 30})  # b's task ran again from its start: never more than its 50
    progress.advance(1, 50, shard="b", status="failed")
    events = [orjson.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["event"], e["documents_done"]) for e in events[1:]] == [
        ("progress", 40), ("progress", 60), ("shard_finished", 100), ("progress", 130), ("progress", 150),
        ("shard_finished", 150)]


class SlowLanded(LandedDocuments):
    """An actor that answers each ``take`` only after a while (a starting or starved actor)."""

    def take_landed(self) -> dict[str, int]:
        time.sleep(0.3)
        return super().take_landed()


@pytest.mark.usefixtures("ray_session")
def test_counts_a_slow_actor_has_not_answered_yet_are_read_later_not_dropped() -> None:
    actor = ray.remote(num_cpus=0)(SlowLanded).remote()
    poll = LandedPoll(actor)
    taken: dict[str, int] = {}
    for documents in (10, 20, 30):
        ray.get(actor.add_landed.remote("a", documents))
        for shard, count in poll.take().items():  # never waits: most calls find the answer not back yet
            taken[shard] = taken.get(shard, 0) + count
    deadline = time.monotonic() + 60
    while taken.get("a", 0) < 60 and time.monotonic() < deadline:
        for shard, count in poll.take().items():
            taken[shard] = taken.get(shard, 0) + count
        time.sleep(0.05)
    assert taken == {"a": 60}
