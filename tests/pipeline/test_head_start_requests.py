"""The head start's requests: sent once, within every server's budget, shared with the senders without overlap."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.head_start_requests import HeadStartRequests, plan_head_start_requests
from teibatch.pipeline.senders import actor as actor_module
from teibatch.pipeline.senders.actor import SenderActor
from teibatch.pipeline.senders.core import SenderCore
from teibatch.pipeline.senders.plans import SenderPlan, ServerPlan, plan_senders
from teibatch.server import HashingEmbedder, text_digest
from teibatch.server.testing import running_server
from teibatch.tei import ClientLimits, EmbedOptions, EmbedResult
from teibatch.tei.packing import PROBE_TEXT
from teibatch.tei.pool import ServerStats
from tests.conftest import write_jsonl

ZERO_VIOLATIONS = {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}
WAIT_S = 30.0


def server_plans(urls: list[str], *, batch: int = 4, inflight: int = 8, payload: int = 2_000_000,
                 max_input_chars: int | None = None) -> list[ServerPlan]:
    limits = ClientLimits(max_batch_size=batch, max_inflight_inputs=inflight, payload_limit=payload,
                          max_input_chars=max_input_chars)
    return [ServerPlan(Endpoint(url), limits) for url in urls]


def whole(servers: Sequence[ServerPlan], embed: EmbedOptions | None = None, dimension: int | None = None) -> SenderPlan:
    """The plan of every server, as the driver builds it before the probe (``dimension``: after it)."""
    return SenderPlan(tuple(servers), "embed", embed or EmbedOptions(), dimension, request_timeout=30, max_retries=3)


def sender_plan(plans: list[ServerPlan], requests: HeadStartRequests | None) -> SenderPlan:
    (plan,) = plan_senders(whole(plans, dimension=384))
    return plan.holding(requests.held) if requests is not None else plan


def texts(count: int, prefix: str = "text") -> list[str]:
    return [f"{prefix} {i} of the first shard" for i in range(count)]


def test_the_drivers_requests_pack_the_first_texts_chunk_by_chunk_and_holds_each_servers_budget() -> None:
    plans = server_plans(["http://127.0.0.1:9", "http://127.0.0.1:10"], batch=4, inflight=10)
    requests = plan_head_start_requests(whole(plans, EmbedOptions()), texts(100), chunk_size=8)
    assert requests is not None
    assert len(requests.chunks) == 13 and requests.keys[:3] == (0, 8, 16) and len(requests.chunks[-1]) == 4
    assert [len(r.positions) for r in requests.planned] == [4] * 25
    assert [r.chunk for r in requests.planned[:4]] == [0, 0, 1, 1]  # requests never cross a chunk
    assert requests.held == {p.endpoint.url: 10 for p in plans}  # until it gives them back


def test_the_driver_leaves_to_the_senders_what_does_not_fit() -> None:
    plans = server_plans(["http://127.0.0.1:9"], batch=4, inflight=6, payload=200, max_input_chars=50)
    first = ["", "x" * 400, "short one", "another short one", "a third", "a fourth", "a fifth", "a sixth"]
    requests = plan_head_start_requests(whole(plans, EmbedOptions(truncate=False)), first, chunk_size=8)
    assert requests is not None
    # The empty text and the one over the length limit are the senders' to reject; the other six go in a
    # request of four and one of two.
    assert [r.positions for r in requests.planned] == [(2, 3, 4, 5), (6, 7)]
    assert plan_head_start_requests(whole(plans, EmbedOptions(truncate=False)), first[:1], chunk_size=8) is None


def test_no_driver_requests_without_texts() -> None:
    plan = whole(server_plans(["http://127.0.0.1:9"]), EmbedOptions())
    assert plan_head_start_requests(plan, [], chunk_size=8) is None


class Landings:
    """What the driver reports, handed over to the event loop that runs the sender, as the driver's Ray calls would."""

    def __init__(self, core: SenderCore | None, loop: asyncio.AbstractEventLoop | None, chunks: int) -> None:
        self.core, self.loop = core, loop
        self.calls: list[tuple[str, int, int, dict[str, int]]] = []
        self.released: Counter[str] = Counter()
        self.deposits: dict[int, EmbedResult] = {}
        self.all_deposited = threading.Event()
        self.chunks = chunks

    def start(self, requests: HeadStartRequests) -> None:
        requests.start(whole(requests.servers), landed=self.landed, released=self.release, deposit=self.deposit)

    def landed(self, url: str, stats: ServerStats) -> None:
        self.calls.append((url, stats.requests, stats.inputs, dict(stats.errors)))
        self._to_sender(lambda core: core.others_landed(url, stats))

    def release(self, url: str, inputs: int) -> None:
        self.released[url] += inputs
        self._to_sender(lambda core: core.others_released(url, inputs))

    def deposit(self, key: int, result: EmbedResult) -> None:
        self.deposits[key] = result
        if len(self.deposits) == self.chunks:
            self.all_deposited.set()

    def _to_sender(self, news: Callable[[SenderCore], None]) -> None:
        if self.core is not None and self.loop is not None:
            core = self.core
            self.loop.call_soon_threadsafe(lambda: news(core))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("senders_running", [False, True])
def test_driver_and_sender_together_never_exceed_the_budget_and_every_text_is_embedded_once(
        senders_running: bool) -> None:
    # Not running: the driver keeps the budget full until it has sent all its texts. Running from the start:
    # the driver sends nothing, gives the whole budget back, and the sender embeds every text itself.
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, simulate_gpu=20_000,
                        record_texts=True) as url:
        plans = server_plans([url])
        first = texts(64)
        requests = plan_head_start_requests(whole(plans, EmbedOptions()), first, chunk_size=32)
        assert requests is not None and requests.held == {url: 8}
        core = SenderCore(sender_plan(plans, requests))

        async def run() -> tuple[EmbedResult, list[EmbedResult], Landings]:
            landings = Landings(core, asyncio.get_running_loop(), len(requests.chunks))
            try:
                landings.start(requests)
                requests.go(384, lambda: senders_running)
                # The sender sends its own texts at once: it has room only as the driver gives it back.
                own = asyncio.ensure_future(core.embed(texts(40, "own")))
                assert await asyncio.to_thread(landings.all_deposited.wait, WAIT_S)
                chunks = [await core.embed_rest(list(requests.chunks[i]), landings.deposits[key])
                          for i, key in enumerate(requests.keys)]
                return await own, chunks, landings
            finally:
                requests.stop()
                await core.close()

        own, chunks, landings = asyncio.run(run())
        server = httpx.get(f"{url}/teibatch/stats", timeout=10).json()
    assert own.ok.all() and all(chunk.ok.all() for chunk in chunks)
    np.testing.assert_allclose(np.vstack([c.vectors for c in chunks]), HashingEmbedder(384).embed(first), atol=1e-6)
    assert server["violations"] == ZERO_VIOLATIONS and server["max_inflight_inputs"] <= 8
    assert Counter(server["texts"]) == Counter(text_digest(t) for t in [*first, *texts(40, "own")])  # once each
    assert landings.released == {url: 8}  # the whole budget came back
    assert landings.calls == ([] if senders_running else [(url, 16, 64, {})])  # told once, all of it back
    report = core.stats()[url]
    assert report["requests"] == 16 + 10 and report["inputs"] == 104
    assert report["max_in_flight"] <= 8
    assert core._start()[0].servers[0].held == 0


@pytest.mark.timeout(60)
def test_requests_the_server_refuses_are_left_to_the_senders() -> None:
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, fault_rate_503=1.0) as url:
        requests = plan_head_start_requests(whole(server_plans([url]), EmbedOptions()), texts(32), chunk_size=32)
        assert requests is not None
        landings = Landings(None, None, chunks=1)
        landings.start(requests)
        requests.go(384, lambda: False)
        assert landings.all_deposited.wait(WAIT_S)
        requests.stop()
    # Each request sent once, none retried by the driver; the budget given back; every text the sender's.
    assert landings.calls == [(url, 0, 0, {"TeiUnavailable": 8})]
    assert landings.released == {url: 8}
    assert list(landings.deposits) == [0] and not landings.deposits[0].ok.any()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("deposit_first", [True, False])
def test_a_sender_answers_a_head_start_chunk_with_the_drivers_vectors_and_embeds_the_rest(deposit_first: bool) -> None:
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, record_texts=True) as url:
        plan = sender_plan(server_plans([url]), None)
        chunk = texts(8)
        expected = HashingEmbedder(384).embed(chunk)
        driver = EmbedResult(np.zeros((8, 384), dtype=np.float32), np.zeros(8, dtype=bool), [],
                             np.zeros(8, dtype=bool))
        driver.vectors[:5], driver.ok[:5] = expected[:5], True

        async def run() -> EmbedResult:
            actor = SenderActor()
            try:
                if deposit_first:
                    await actor.deposit(0, driver)
                    return await actor.embed(chunk, 0.0, plan, 0)
                waiting = asyncio.ensure_future(actor.embed(chunk, 0.0, plan, 0))
                await asyncio.sleep(0.2)
                assert not waiting.done()  # it waits for the driver's vectors
                await actor.deposit(0, driver)
                return await waiting
            finally:
                await actor.close()

        result = asyncio.run(run())
        server = httpx.get(f"{url}/teibatch/stats", timeout=10).json()
    assert result.ok.all()
    np.testing.assert_allclose(result.vectors, expected, atol=1e-6)
    assert Counter(server["texts"]) == Counter(text_digest(t) for t in chunk[5:])  # only what the driver missed


@pytest.mark.timeout(60)
def test_a_restarted_sender_or_one_that_never_gets_the_vectors_embeds_the_chunk_itself(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(actor_module, "DRIVER_WAIT_MARGIN_S", 0.3)
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, record_texts=True) as url:
        plan = sender_plan(server_plans([url]), None)
        holding = dataclasses.replace(plan, held=(8,))  # the driver would hold the whole budget
        impatient = dataclasses.replace(plan, request_timeout=0.1)
        chunk = texts(8)

        async def run(restarted: bool) -> tuple[EmbedResult, float]:
            actor = SenderActor()
            actor.restarted = restarted
            started = time.monotonic()
            try:
                if restarted:
                    # A restarted sender takes no hold either: the whole budget is its own.
                    result = await actor.embed(chunk, 0.0, holding, 0)
                    assert actor.core is not None and actor.core._start()[0].servers[0].held == 0
                    return result, time.monotonic() - started
                return await actor.embed(chunk, 0.0, impatient, 0), time.monotonic() - started
            finally:
                await actor.close()

        restarted, quick = asyncio.run(run(True))
        waited, slow = asyncio.run(run(False))
        server = httpx.get(f"{url}/teibatch/stats", timeout=10).json()
    assert restarted.ok.all() and waited.ok.all()
    assert quick < 0.3 <= slow  # the first waited for nothing; the second for the driver, in vain
    assert Counter(server["texts"]) == Counter(text_digest(t) for t in chunk * 2)


@pytest.mark.timeout(240)
def test_a_run_sends_its_first_requests_from_the_driver_and_embeds_every_text_once(
        tmp_path: Path, ray_session: None, monkeypatch: pytest.MonkeyPatch) -> None:
    told: list[tuple[int, int]] = []
    go = HeadStartRequests.go

    def recording_go(requests: HeadStartRequests, dimension: int, senders_running: Callable[[], bool]) -> None:
        told.append((sum(requests.held.values()), dimension))
        go(requests, dimension, senders_running)

    monkeypatch.setattr(HeadStartRequests, "go", recording_go)
    documents = [{"id": f"d{i}", "text": f"document {i} of the corpus"} for i in range(300)]
    write_jsonl(tmp_path / "corpus" / "part-0.jsonl", documents)
    with running_server(subprocess=True, max_client_batch_size=4, max_concurrent_requests=8, simulate_gpu=20_000,
                        record_texts=True) as url:
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump({
            "corpus": {"path": str(tmp_path / "corpus"), "id_field": "id"},
            "servers": {"provider": "static", "urls": [url]}, "output": {"path": str(tmp_path / "out")}}))
        summary = run_job(load_job(job))
        server = httpx.get(f"{url}/teibatch/stats", timeout=10).json()
    assert told == [(8, 384)]  # the driver held the server's whole budget, then sent once the probe answered
    # One server, so no copies at the end: every text was embedded exactly once, by the driver or a sender.
    expected = Counter(text_digest(str(d["text"])) for d in documents) + Counter([text_digest(PROBE_TEXT)])
    assert Counter(server["texts"]) == expected
    assert server["violations"] == ZERO_VIOLATIONS and server["max_inflight_inputs"] <= 8
    (seen,) = summary.servers.values()
    assert seen["inputs"] == 300 and int(seen["max_in_flight"]) <= 8  # type: ignore[call-overload]


@pytest.mark.timeout(60)
def test_driver_requests_never_told_to_go_sends_nothing_and_stops_at_once() -> None:
    # The probe failed (a wrong key, say): the run ends, and the requests with it, without a word.
    with running_server(max_client_batch_size=4, max_concurrent_requests=8) as url:
        requests = plan_head_start_requests(whole(server_plans([url]), EmbedOptions()), texts(32), chunk_size=32)
        assert requests is not None
        landings = Landings(None, None, chunks=1)
        landings.start(requests)
        time.sleep(0.3)  # it opens its first connections meanwhile
        started = time.monotonic()
        requests.stop()
        stopped_in = time.monotonic() - started
        server = httpx.get(f"{url}/teibatch/stats", timeout=10).json()
    assert stopped_in < 1.0
    # One connection per request the server takes at once (8 inputs in requests of 4, plus one), no embedding.
    assert server["requests"]["by_route"].get("/embed", 0) == 0 and server["requests"]["by_route"]["/info"] == 3
    assert landings.calls == [] and not landings.deposits and not landings.released
