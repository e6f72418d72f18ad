"""The driver's first wave: sent once, within every server's budget, shared with the senders without overlap."""

from __future__ import annotations

import asyncio
import dataclasses
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import numpy as np
import pytest
import yaml

from teibatch.endpoint import Endpoint
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline import senders as senders_module
from teibatch.pipeline.first_wave import FirstWave, plan_first_wave
from teibatch.pipeline.senders import SenderActor, SenderCore, SenderPlan, ServerPlan, plan_senders
from teibatch.server import HashingEmbedder, text_digest
from teibatch.server.testing import running_server
from teibatch.tei import ClientLimits, EmbedOptions, EmbedResult
from teibatch.tei.packing import PROBE_TEXT
from tests.conftest import write_jsonl

ZERO_VIOLATIONS = {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}
WAIT_S = 30.0


def server_plans(urls: list[str], *, batch: int = 4, inflight: int = 8, payload: int = 2_000_000,
                 max_input_chars: int | None = None) -> list[ServerPlan]:
    limits = ClientLimits(max_batch_size=batch, max_inflight_inputs=inflight, payload_limit=payload,
                          max_input_chars=max_input_chars)
    return [ServerPlan(Endpoint(url), limits) for url in urls]


def sender_plan(plans: list[ServerPlan], wave: FirstWave | None) -> SenderPlan:
    (plan,) = plan_senders(plans, route="embed", embed=EmbedOptions(), dimension=384, model_id=None,
                           api_key_env=None, request_timeout=30, max_retries=3,
                           held=wave.held if wave is not None else None)
    return plan


def texts(count: int, prefix: str = "text") -> list[str]:
    return [f"{prefix} {i} of the first shard" for i in range(count)]


def test_the_wave_takes_whole_chunks_within_every_servers_budget() -> None:
    plans = server_plans(["http://127.0.0.1:9", "http://127.0.0.1:10"], batch=4, inflight=10)
    wave = plan_first_wave(plans, "embed", EmbedOptions(), texts(100), chunk_size=8)
    assert wave is not None
    # 20 inputs of budget: two chunks of 8; each server takes at most 10 inputs and 10 // 4 + 1 requests.
    assert len(wave.chunks) == 2 and wave.keys == (0, 8)
    per_server: Counter[int] = Counter()
    for request in wave.requests:
        assert request.request.count <= 4
        per_server[request.server] += request.request.count
    assert max(per_server.values()) <= 10
    assert sum(wave.held.values()) == sum(per_server.values()) == 16
    assert wave.held == {p.endpoint.url: per_server[i] for i, p in enumerate(plans)}


def test_the_wave_leaves_to_the_senders_what_does_not_fit() -> None:
    plans = server_plans(["http://127.0.0.1:9"], batch=4, inflight=6, payload=200, max_input_chars=50)
    first = ["", "x" * 400, "short one", "another short one", "a third", "a fourth", "a fifth", "a sixth"]
    wave = plan_first_wave(plans, "embed", EmbedOptions(truncate=False), first, chunk_size=8)
    assert wave is not None
    # The empty text and the one over the length limit are the senders' to reject; the other six go in a
    # request of four and one of two (the server takes 6 inputs in 2 requests).
    assert [r.positions for r in wave.requests] == [(2, 3, 4, 5), (6, 7)]
    assert wave.held == {plans[0].endpoint.url: 6}
    assert plan_first_wave(plans, "embed", EmbedOptions(truncate=False), first[:1], chunk_size=8) is None


def test_no_wave_without_texts() -> None:
    assert plan_first_wave(server_plans(["http://127.0.0.1:9"]), "embed", EmbedOptions(), [], chunk_size=8) is None


class Landings:
    """What the wave reports, handed over to the event loop that runs the sender, as the driver's Ray calls would."""

    def __init__(self, core: SenderCore, loop: asyncio.AbstractEventLoop) -> None:
        self.core, self.loop = core, loop
        self.calls: list[tuple[str, int, bool, str | None]] = []
        self.deposits: dict[int, EmbedResult] = {}
        self.all_deposited = threading.Event()
        self.expected = 0

    def landed(self, url: str, inputs: int, sent_at: float, used: bool, error: str | None) -> None:
        self.calls.append((url, inputs, used, error))
        self.loop.call_soon_threadsafe(lambda: self.core.others_landed(url, inputs, sent_at=sent_at, used=used,
                                                                       error=error))

    def deposit(self, key: int, result: EmbedResult) -> None:
        self.deposits[key] = result
        if len(self.deposits) == self.expected:
            self.all_deposited.set()


@pytest.mark.timeout(60)
def test_wave_and_sender_together_never_exceed_the_budget_and_every_text_is_embedded_once() -> None:
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, simulate_gpu=20_000,
                        record_texts=True) as url:
        plans = server_plans([url])
        first = texts(64)
        wave = plan_first_wave(plans, "embed", EmbedOptions(), first, chunk_size=32)
        assert wave is not None and wave.held == {url: 8}  # the whole budget, in two requests
        core = SenderCore(sender_plan(plans, wave))

        async def run() -> tuple[EmbedResult, EmbedResult, Landings]:
            landings = Landings(core, asyncio.get_running_loop())
            landings.expected = len(wave.chunks)
            try:
                wave.start(options=EmbedOptions(), request_timeout=30, model_id=None,
                           api_key_env=None, landed=landings.landed, deposit=landings.deposit)
                wave.go(384)
                # The sender sends its own texts at once: it has room only as the wave's requests land.
                own = asyncio.ensure_future(core.embed(texts(40, "own")))
                await asyncio.to_thread(landings.all_deposited.wait, WAIT_S)
                rest = await core.embed_rest(first[:32], landings.deposits[0])
                return await own, rest, landings
            finally:
                wave.stop()
                await core.close()

        own, rest, landings = asyncio.run(run())
        server = httpx.get(f"{url}/teibatch/stats", timeout=10).json()
    assert own.ok.all() and rest.ok.all()
    np.testing.assert_allclose(rest.vectors, HashingEmbedder(384).embed(first[:32]), atol=1e-6)
    assert server["violations"] == ZERO_VIOLATIONS and server["max_inflight_inputs"] <= 8
    # The wave sent its 8 texts once; the sender sent the other 24 of chunk 0 and its own 40; nothing twice.
    assert Counter(server["texts"]) == Counter(text_digest(t) for t in [*first[:32], *texts(40, "own")])
    assert [(inputs, used) for _, inputs, used, _ in landings.calls] == [(4, True), (4, True)]
    report = core.stats()[url]
    assert report["requests"] == 2 + 6 + 10 and report["inputs"] == 72
    assert report["max_in_flight"] <= 8
    assert core._start()[0].servers[0].held == 0  # the whole budget is the sender's again


@pytest.mark.timeout(60)
def test_requests_the_server_refuses_are_left_to_the_senders() -> None:
    with running_server(max_client_batch_size=4, max_concurrent_requests=8, fault_rate_503=1.0) as url:
        wave = plan_first_wave(server_plans([url]), "embed", EmbedOptions(), texts(32), chunk_size=32)
        assert wave is not None
        calls: list[tuple[int, bool, str | None]] = []
        deposits: dict[int, EmbedResult] = {}
        done = threading.Event()

        def deposit(key: int, result: EmbedResult) -> None:
            deposits[key] = result
            done.set()

        wave.start(options=EmbedOptions(), request_timeout=30, model_id=None, api_key_env=None,
                   landed=lambda url, inputs, sent_at, used, error: calls.append((inputs, used, error)),
                   deposit=deposit)
        wave.go(384)
        assert done.wait(WAIT_S)
        wave.stop()
    assert calls == [(4, False, "TeiUnavailable"), (4, False, "TeiUnavailable")]
    assert list(deposits) == [0] and not deposits[0].ok.any()  # every text of the chunk is the sender's to embed


@pytest.mark.timeout(60)
@pytest.mark.parametrize("deposit_first", [True, False])
def test_a_sender_answers_a_wave_chunk_with_the_drivers_vectors_and_embeds_the_rest(deposit_first: bool) -> None:
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
    monkeypatch.setattr(senders_module, "WAVE_WAIT_MARGIN_S", 0.3)
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
    go = FirstWave.go

    def recording_go(wave: FirstWave, dimension: int) -> None:
        told.append((sum(wave.held.values()), dimension))
        go(wave, dimension)

    monkeypatch.setattr(FirstWave, "go", recording_go)
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
