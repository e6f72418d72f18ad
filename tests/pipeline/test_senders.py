"""Senders own the servers: one live budget per server, shared by whoever sends, across nodes and deaths."""

from __future__ import annotations

import asyncio
import dataclasses
import gc
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import orjson
import pyarrow.dataset as ds
import pytest
import ray
import yaml

from teibatch.crashpoints import CRASH_AT, CRASH_ONCE
from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline.opening import EarlyActors, Opening, prelaunch_senders
from teibatch.pipeline.senders.actor import SenderActor, start_senders, stop_senders
from teibatch.pipeline.senders.core import SenderCore, Streams
from teibatch.pipeline.senders.plans import (
    SERVERS_PER_SENDER,
    SenderPlan,
    SenderRef,
    ServerPlan,
    least_loaded,
    plan_senders,
)
from teibatch.pipeline.senders.sending import embed_through_senders
from teibatch.server.backends import HashingEmbedder
from teibatch.server.testing import running_server
from teibatch.tei import ClientLimits, EmbedOptions, EmbedResult
from tests.conftest import write_jsonl

LIMITS = ("--max-client-batch-size", "4", "--max-concurrent-requests", "8", "--simulate-gpu", "20000")


def stats(url: str) -> dict[str, object]:
    return dict(httpx.get(f"{url}/teibatch/stats", timeout=10).json())


def plan_for(urls: list[str], batch: int = 4, inflight: int = 8) -> SenderPlan:
    limits = ClientLimits(max_batch_size=batch, max_inflight_inputs=inflight, payload_limit=2_000_000)
    (plan,) = plan_senders(SenderPlan(tuple(ServerPlan(Endpoint(u), limits) for u in urls), "embed", EmbedOptions(),
                                      384, request_timeout=30, max_retries=3))
    return plan


@pytest.mark.timeout(60)
def test_a_sender_opens_its_connections_once_before_it_knows_the_vector_size() -> None:
    # Planned before the servers' probe: it opens a connection per request the server takes at once
    # (8 inputs / 4 a request, and one for a smaller request), with /info, which TEI answers without
    # queueing behind a batch.
    with running_server(max_client_batch_size=4, max_concurrent_requests=8) as url:
        early = dataclasses.replace(plan_for([url]), dimension=None)
        core = SenderCore(early)

        async def connect_then_embed() -> None:
            try:
                await asyncio.gather(core.connect(), core.connect())
                await core.connect()
                assert stats(url)["requests"]["by_route"]["/info"] == 3  # type: ignore[index]
                core.probed(384)
                result = await core.embed([f"text {i}" for i in range(8)])
                assert result.ok.all() and result.vectors.shape == (8, 384)
            finally:
                await core.close()

        asyncio.run(connect_then_embed())


@pytest.mark.timeout(60)
def test_concurrent_chunks_share_one_budget_in_full_batches() -> None:
    # Five "shard tasks" send at once: together they fill the server's 8 inputs, never more, and no
    # request is shrunk below the batch size because others are sending too.
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, simulate_gpu=20_000) as url:
        core = SenderCore(plan_for([url]))

        async def send_all() -> list[np.ndarray]:
            chunks = [[f"chunk {c} text {i}" for i in range(40)] for c in range(5)]
            try:
                results = await asyncio.gather(*(core.embed(chunk) for chunk in chunks))
            finally:
                await core.close()
            assert all(r.ok.all() and not r.failures for r in results)
            return [r.vectors for r in results]

        vectors = asyncio.run(send_all())
        server = stats(url)
    assert server["max_inflight_inputs"] == 8
    assert server["violations"] == {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}
    assert server["requests"]["by_route"]["/embed"] == 50  # type: ignore[index]  # 200 texts / 4: all full
    expected = HashingEmbedder(384).embed([f"chunk 2 text {i}" for i in range(40)])
    np.testing.assert_allclose(vectors[2], expected, atol=1e-6)
    report = core.stats()[url]
    assert report["max_in_flight"] == 8 and report["mean_inputs_per_request"] == 4.0
    assert 0 < report["busy_share"] <= 1  # type: ignore[operator]


@pytest.mark.timeout(60)
def test_a_chunk_whose_texts_are_all_out_lets_the_next_chunk_in() -> None:
    # A sender admits 3 chunks of texts still to send at once (budget 32, chunks of up to 256); five
    # one-request chunks against a server that takes a while per request: all five are out at once,
    # not three, because each gives its slot up once its request is out.
    with running_server(max_client_batch_size=4, max_concurrent_requests=32, simulate_gpu=40,
                        max_batch_requests=1) as url:
        core = SenderCore(plan_for([url], inflight=32))

        async def send_all() -> None:
            try:
                results = await asyncio.gather(*(core.embed([f"chunk {c} text {i}" for i in range(4)])
                                                 for c in range(5)))
            finally:
                await core.close()
            assert all(r.ok.all() and not r.failures for r in results)

        asyncio.run(send_all())
    assert core.stats()[url]["max_in_flight"] == 20


def test_streams_say_all_work_is_in_once_every_last_shard_has_sent_everything() -> None:
    streams = Streams()
    assert not streams.all_in()  # the driver has not said which shards are the last ones
    streams.finished("a")
    streams.last_ones(["a", "b"])
    assert not streams.all_in()
    streams.finished("b")
    assert streams.all_in()
    woken: list[str] = []
    streams.changed = lambda: woken.append("woken")
    streams.finished("b")  # said twice: nothing changes
    streams.finished("c")
    assert woken == ["woken"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("last_shards_done", [True, False])
def test_a_sender_copies_slow_requests_to_an_idle_server_only_at_the_end(last_shards_done: bool) -> None:
    # One server answers in milliseconds, the other holds its requests for seconds: once every shard has
    # sent its texts, the fast one answers copies of the slow one's last requests; before, never.
    with running_server(max_client_batch_size=4, max_concurrent_requests=16, simulate_gpu=300,
                        max_batch_requests=1) as slow, \
            running_server(max_client_batch_size=4, max_concurrent_requests=16) as fast:
        core = SenderCore(plan_for([slow, fast], inflight=16))
        if last_shards_done:
            core.streams.last_ones([])

        async def send() -> None:
            try:
                result = await core.embed([f"text {i}" for i in range(200)])
            finally:
                await core.close()
            assert result.ok.all() and not result.failures

        asyncio.run(send())
    report = core.stats()
    if last_shards_done:
        assert int(report[fast]["copies_won"]) > 0  # type: ignore[call-overload]
    else:
        assert report[fast]["copies"] == 0 and report[slow]["copies"] == 0


def test_senders_are_sized_by_servers() -> None:
    limits = ClientLimits(max_batch_size=32, max_inflight_inputs=512, payload_limit=2_000_000)
    servers = [ServerPlan(Endpoint(f"http://127.0.0.1:{9000 + i}"), limits) for i in range(2 * SERVERS_PER_SENDER + 1)]
    plans = plan_senders(SenderPlan(tuple(servers), "embed", EmbedOptions(), 384, request_timeout=30, max_retries=3))
    assert len(plans) == 3
    assert sorted(p.endpoint.url for plan in plans for p in plan.servers) == sorted(s.endpoint.url for s in servers)
    assert plans[0].budget == 512 * len(plans[0].servers)
    # A chunk: 8 budgets of texts, as long as their 384 float32s fit 16 MiB; never under 8 full requests.
    assert plans[0].chunk_size == min(8 * plans[0].budget, 16 * 2**20 // (4 * 384)) == 10922
    assert dataclasses.replace(plans[0], dimension=None).chunk_size == 8 * plans[0].budget
    assert dataclasses.replace(plans[0], dimension=4096).chunk_size == 16 * 2**20 // (4 * 4096)
    assert dataclasses.replace(plans[0], dimension=30522).chunk_size == 8 * 32
    tight = dataclasses.replace(plans[0], servers=(ServerPlan(Endpoint("http://127.0.0.1:9100"),
                                                  ClientLimits(max_batch_size=8, max_inflight_inputs=24,
                                                               payload_limit=2_000_000)),))
    assert tight.chunk_size == 8 * 24


def test_the_next_chunk_goes_to_the_sender_with_the_least_outstanding_per_input_of_its_budget() -> None:
    def sender(inflight: int) -> SenderRef:
        limits = ClientLimits(max_batch_size=4, max_inflight_inputs=inflight, payload_limit=20_000)
        return SenderRef(None, SenderPlan((ServerPlan(Endpoint("http://127.0.0.1:9"), limits),), "embed",
                                          EmbedOptions(), 384))

    senders = [sender(8), sender(32)]
    assert least_loaded(senders, [4, 8]) == 1  # 8 of 32 is less than 4 of 8
    assert least_loaded(senders, [1, 8]) == 0
    assert least_loaded(senders, [0, 0]) == 0  # a tie goes to the first
    assert least_loaded(senders, [4, 8], among=[0]) == 0  # only those still alive


def test_a_senders_process_imports_neither_the_task_side_nor_a_corpus_reader() -> None:
    # Ray loads the actor's class by its module in a fresh process: the less it imports, the sooner it runs.
    loaded = subprocess.run([sys.executable, "-c", "import sys, teibatch.pipeline.senders.actor; "
                             "print(' '.join(sorted(sys.modules)))"], capture_output=True, text=True, timeout=60,
                            check=True).stdout.split()
    assert "teibatch.pipeline.senders.plans" in loaded
    assert not {"teibatch.corpus", "teibatch.pipeline.senders.sending", "pyarrow"} & set(loaded)


def static_job(tmp_path: Path, urls: list[str], **limits: object) -> Path:
    for f in range(4):
        write_jsonl(tmp_path / "c" / f"f{f}.jsonl",
                    [{"id": f"{f}-{i}", "text": f"document {i} of file {f}"} for i in range(60)])
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(tmp_path / "c"), "id_field": "id", "shard_docs": 20},
        "servers": {"provider": "static", "urls": urls}, "output": {"path": str(tmp_path / "out")},
        "limits": {"max_shards_in_flight": 2, **limits}}))
    return job


def check_output(out: Path) -> dict[str, object]:
    table = ds.dataset(out / "vectors").to_table()
    ids = table.column("id").to_pylist()
    assert sorted(ids) == sorted(f"{f}-{i}" for f in range(4) for i in range(60))
    expected = HashingEmbedder(384).embed(["document 7 of file 2"])[0]
    row = ids.index("2-7")
    np.testing.assert_allclose(np.asarray(table.column("embedding")[row].as_py()), expected, atol=1e-6)
    return dict(orjson.loads(next((out / "runs").iterdir()).read_bytes()))


@pytest.mark.timeout(240)
def test_budget_holds_across_nodes_while_both_send(tmp_path: Path, two_node_cluster: str) -> None:
    with running_server(subprocess=True, max_client_batch_size=4, max_concurrent_requests=8,
                        simulate_gpu=20_000) as url:
        done = subprocess.run([sys.executable, "-m", "teibatch", "run", str(static_job(tmp_path, [url])), "-q",
                               "--ray-address", two_node_cluster], env=os.environ.copy(), capture_output=True,
                              text=True, timeout=200, check=False)
        assert done.returncode == 0, done.stderr
        server = stats(url)
    report = check_output(tmp_path / "out")
    assert len(report["shards_per_node"]) == 2, report["shards_per_node"]  # type: ignore[arg-type]
    assert server["max_inflight_inputs"] == 8  # the whole budget was used ...
    assert server["violations"]["inflight"] == 0  # type: ignore[index]  # ... and never more
    assert server["max_inputs_per_request"] == 4
    (seen,) = report["servers"].values()  # type: ignore[attr-defined]
    assert seen["max_in_flight"] == 8 and seen["inputs"] == 240


@pytest.mark.timeout(240)
def test_a_killed_sender_is_replaced_and_every_document_lands_once(tmp_path: Path, ray_session: None) -> None:
    marker = tmp_path / "crashed"
    address = ray.get_runtime_context().gcs_address
    with running_server(subprocess=True, max_client_batch_size=4, max_concurrent_requests=8,
                        simulate_gpu=20_000) as url:
        env = {**os.environ, CRASH_AT: "sender-chunk:3", CRASH_ONCE: str(marker)}
        done = subprocess.run([sys.executable, "-m", "teibatch", "run", str(static_job(tmp_path, [url])), "-q",
                               "--ray-address", address], env=env, capture_output=True, text=True, timeout=200,
                              check=False)
        assert done.returncode == 0, done.stderr
        server = stats(url)
    assert marker.exists(), "the sender was killed on its third chunk"
    report = check_output(tmp_path / "out")
    # The replacement sender had the whole budget again: nothing of the dead one stayed counted.
    (seen,) = report["servers"].values()  # type: ignore[attr-defined]
    assert seen["max_in_flight"] == 8
    assert server["inputs_embedded"] >= 240


@pytest.mark.timeout(240)
def test_at_the_end_of_a_run_an_idle_server_answers_for_a_slow_one(tmp_path: Path, ray_session: None) -> None:
    # The driver names the last shards, each shard says when it has sent everything: then the senders
    # copy the slow server's last requests to the idle one. Every document lands once all the same.
    address = ray.get_runtime_context().gcs_address
    with running_server(subprocess=True, max_client_batch_size=4, max_concurrent_requests=16, simulate_gpu=300,
                        max_batch_requests=1) as slow, \
            running_server(subprocess=True, max_client_batch_size=4, max_concurrent_requests=16) as fast:
        done = subprocess.run([sys.executable, "-m", "teibatch", "run", str(static_job(tmp_path, [slow, fast])), "-q",
                               "--ray-address", address], env=os.environ.copy(), capture_output=True, text=True,
                              timeout=200, check=False)
        assert done.returncode == 0, done.stderr
        violations = [stats(url)["violations"] for url in (slow, fast)]
    report = check_output(tmp_path / "out")
    servers = report["servers"]
    assert int(servers[fast]["copies_won"]) > 0, servers  # type: ignore[index]
    assert violations == [{"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}] * 2


@pytest.mark.timeout(120)
def test_a_shard_s_first_chunk_is_sent_before_the_rest_is_read(ray_session: None) -> None:
    # The texts come from a generator that, once a chunk has been taken, waits (bounded) for the server
    # to see a request: were the texts all read before sending, it would wait in vain and the test fail.
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, simulate_gpu=20_000) as url:
        (sender,), _ = start_senders([plan_for([url])])
        try:
            seen_before_the_rest: list[int] = []

            def texts() -> Iterator[str]:
                for i in range(3 * sender.chunk_size):
                    if i == sender.first_chunk_size:
                        deadline = time.monotonic() + 20
                        while not stats(url)["inputs_embedded"] and time.monotonic() < deadline:
                            time.sleep(0.05)
                        seen_before_the_rest.append(int(stats(url)["inputs_embedded"]))  # type: ignore[call-overload]
                    yield f"text {i}"

            result = embed_through_senders(texts(), [sender], 384)
        finally:
            stop_senders([sender.actor])
    assert seen_before_the_rest and seen_before_the_rest[0] > 0
    assert result.ok.all() and len(result.ok) == 3 * sender.chunk_size and not result.failures


class ChunkRecorder:
    """A sender that only notes the size of each chunk it is sent and answers it with zero vectors."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    def embed(self, texts: list[str], priority: float, plan: SenderPlan) -> EmbedResult:
        self.sizes.append(len(texts))
        result = EmbedResult.blank(len(texts), 4, sparse=False)
        result.ok[:] = True
        return result

    def stream_done(self, stream: str) -> None:
        pass

    def chunks(self) -> list[int]:
        return self.sizes


@pytest.mark.timeout(120)
def test_a_shard_s_chunks_grow_from_a_few_requests_to_the_full_size(ray_session: None) -> None:
    plan = plan_for(["http://127.0.0.1:9"], batch=4, inflight=64)  # never reached: the recorder answers
    assert (plan.first_chunk_size, plan.chunk_size) == (8 * 4, 8 * 64)
    recorder = ray.remote(ChunkRecorder).remote()
    result = embed_through_senders((f"text {i}" for i in range(2000)), [SenderRef(recorder, plan)], 4, stream="s")
    assert result.ok.all() and len(result.ok) == 2000
    assert ray.get(recorder.chunks.remote()) == [32, 128, 512, 512, 512, 2000 - 32 - 128 - 3 * 512]


def test_a_warmed_sender_keeps_its_start_up_objects_out_of_the_collectors_scans() -> None:
    gc.unfreeze()
    try:
        asyncio.run(SenderActor().warm())
        assert gc.get_freeze_count() > 1000  # the process's modules and everything they hold
    finally:
        gc.unfreeze()


def test_senders_started_before_the_fleet_are_its_senders_when_it_has_the_servers_asked_for(
        tmp_path: Path, ray_session: None) -> None:
    # Nothing listens on these ports: an opening contacts no server until it meets them.
    urls = [f"http://127.0.0.1:{port}" for port in (9, 10, 11, 12, 13)]
    job = load_job(static_job(tmp_path, urls))
    early = prelaunch_senders(job)
    assert len(early) == 2  # five servers, at most four a sender
    opening = Opening(job, EmbedOptions(), [Endpoint(url) for url in urls], shards=4, prelaunched=early)
    try:
        assert [a._actor_id for a in opening.actors] == [a._actor_id for a in early]
    finally:
        opening.close()
    # Four servers came up of the five asked for: one sender serves them, the two started early are stopped.
    early = prelaunch_senders(job)
    opening = Opening(job, EmbedOptions(), [Endpoint(url) for url in urls[:4]], shards=4, prelaunched=early)
    try:
        assert len(opening.actors) == 1 and opening.actors[0]._actor_id not in {a._actor_id for a in early}
        for actor in early:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(actor.stats.remote(), timeout=30)
    finally:
        opening.close()


def test_workers_warmed_while_the_fleet_comes_up_are_the_opening_s(tmp_path: Path, ray_session: None) -> None:
    job = load_job(static_job(tmp_path, ["http://127.0.0.1:9"]))
    early = EarlyActors.start(job, senders=False)
    early.warm_workers(shards=4)
    assert len(early.workers) == 1  # one machine: one; the ramp starts the others (pipeline/ramp.py)
    assert ray.get(early.workers, timeout=60) == [None]
    opening = Opening(job, EmbedOptions(), [Endpoint("http://127.0.0.1:9")], shards=4, warming=early.workers)
    try:
        assert opening.workers == early.workers  # none started again
    finally:
        opening.close()
        early.stop()


def test_the_run_s_early_actors_all_stop(tmp_path: Path, ray_session: None) -> None:
    job = load_job(static_job(tmp_path, ["http://127.0.0.1:9"]))
    early = EarlyActors.start(job)
    assert len(early.senders) == 1 and early.dedup is not None
    assert ray.get(early.senders[0].take_landed.remote(), timeout=60) == {}  # up and answering
    early.stop()
    calls = {"sender": lambda: early.senders[0].stats.remote(),
             "dedup": lambda: early.dedup.registry.release.remote([])}  # type: ignore[union-attr]
    stopped = set()
    for name, call in calls.items():
        try:
            ray.get(call(), timeout=30)
        except ray.exceptions.RayActorError:
            stopped.add(name)
    assert stopped == set(calls)
