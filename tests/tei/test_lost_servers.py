"""Servers the cloud takes back mid-run (``EndpointPool.lose``), and replacements joining (``expect``/``add``).

The built-in servers count every text they embed, so each test checks that every text got its own
vector, that the lost server's requests went elsewhere at once (not after a timeout), and that a
recalled request did not count as a failed try.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import httpx
import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable
from teibatch.server import text_digest
from teibatch.tei import ClientLimits, EndpointPool, Server, TeiClient, embedder
from teibatch.tei.work import FAILURE_EMBED
from tests.tei.conftest import TINY, ServerHandle, corpus, embed
from tests.tei.test_embedder import assert_all_embedded

Start = Callable[..., ServerHandle]
LIMITS = ClientLimits(max_batch_size=4, max_inflight_inputs=8, payload_limit=20_000)
WAIT_S = 20.0


async def until(condition: Callable[[], bool], timeout: float = WAIT_S) -> None:
    """Poll ``condition`` on the event loop (bounded)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.01)


def server_of(pool: EndpointPool, url: str) -> Server:
    return next(s for s in pool.servers if s.url == url)


def test_a_lost_server_s_requests_go_to_the_others_at_once(tei: Start) -> None:
    # The doomed server answers nothing for 30 s, as an instance whose packets the cloud now drops.
    silent = tei(**TINY, record_texts=True, fault_rate_latency=1.0, fault_latency_s=30.0)
    steady = tei(**TINY, record_texts=True)
    texts = corpus(200)
    recalled: list[int] = []

    async def take_back(pool: EndpointPool, http: httpx.AsyncClient) -> None:
        doomed = server_of(pool, silent.url)
        await until(lambda: doomed.in_flight > 0)
        recalled.append(doomed.in_flight)
        assert pool.lose(silent.url) is True
        assert pool.lose(silent.url) is False  # once
        assert not doomed.healthy and doomed.lost
        await until(lambda: doomed.in_flight == 0, timeout=2.0)  # the recalled requests left its budget

    done = embed([silent.url, steady.url], texts, timeout=60.0, limits=LIMITS, beside=take_back)
    assert_all_embedded(done, texts)
    assert recalled and recalled[0] > 0
    assert done.seconds < 15  # not the 30 s the silent server would have taken, nor the 60 s timeout
    assert steady.stats()["texts"].keys() == {text_digest(t) for t in texts}
    lost = done.stats[silent.url]
    assert lost["inputs"] == 0 and lost["retries"] == 0 and lost["errors"] == {}  # recalled, not failed


def lose_at_first_send(monkeypatch: pytest.MonkeyPatch, url: str) -> list[list[int]]:
    """Make the pool lose ``url`` right after its first request's task is made, before that task's
    first step (the cloud's word can come then); gives the positions that request carried, once sent."""
    send = embedder._Run._send
    carried: list[list[int]] = []

    def send_then_lose(run: embedder._Run, flight: embedder._Flight) -> None:
        send(run, flight)
        if flight.server.url == url and not carried:
            carried.append([item.position for item in flight.items])
            assert run.pool.lose(url)

    monkeypatch.setattr(embedder._Run, "_send", send_then_lose)
    return carried


def test_a_request_lost_before_it_started_puts_its_texts_back(tei: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    # A task cancelled before its first step never runs its body: the recall itself puts the texts back.
    doomed = tei(**TINY, record_texts=True)
    steady = tei(**TINY, record_texts=True)
    texts = corpus(120)
    carried = lose_at_first_send(monkeypatch, doomed.url)
    done = embed([doomed.url, steady.url], texts, limits=LIMITS)
    assert carried and carried[0]
    assert_all_embedded(done, texts)
    assert steady.stats()["texts"].keys() == {text_digest(t) for t in texts}
    assert done.stats[doomed.url]["inputs"] == 0


def test_a_text_the_client_lost_track_of_is_a_failure_to_send_again(tei: Start,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # Were a fault to drop texts (here: a recall that only cancels, as before the fix above), they come
    # back as retryable failures, so the shard is not committed without them.
    doomed = tei(**TINY)
    steady = tei(**TINY)
    carried = lose_at_first_send(monkeypatch, doomed.url)

    def cancel_only(run: embedder._Run, task: asyncio.Task[None], flight: embedder._Flight) -> None:
        flight.recalled = True
        task.cancel()

    monkeypatch.setattr(embedder._Run, "_recall", cancel_only)
    done = embed([doomed.url, steady.url], corpus(120), limits=LIMITS)
    assert carried and carried[0]
    assert [(f.position, f.reason) for f in done.result.failures] == [(p, FAILURE_EMBED) for p in sorted(carried[0])]
    assert "no answer came back" in done.result.failures[0].detail
    assert done.result.ok.sum() == 120 - len(carried[0])


def test_a_call_that_fails_right_after_sending_leaves_no_inputs_counted(tei: Start,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    # The pool outlives one embed_texts call (a sender keeps it for the run): the requests of a call
    # that fails must leave their servers' budgets, those whose tasks never started included.
    server = tei(**TINY)
    send = embedder._Run._send
    pools: list[EndpointPool] = []

    def send_then_fail(run: embedder._Run, flight: embedder._Flight) -> None:
        send(run, flight)
        pools.append(run.pool)
        raise RuntimeError("the call fails here")

    async def keep_pool(pool: EndpointPool, http: httpx.AsyncClient) -> None:
        pools.append(pool)

    monkeypatch.setattr(embedder._Run, "_send", send_then_fail)
    with pytest.raises(RuntimeError, match="the call fails here"):
        embed([server.url], corpus(50), limits=LIMITS, beside=keep_pool)
    assert len(pools) == 2 and pools[0] is pools[1]
    assert [(s.in_flight, s.requests_in_flight) for s in pools[0].servers] == [(0, 0)]


def test_with_no_server_left_the_pool_waits_for_the_replacement(tei: Start) -> None:
    only = tei(**TINY, record_texts=True, simulate_gpu=20_000.0, batch_overhead_s=0.01)
    replacement = tei(**TINY, record_texts=True)
    texts = corpus(300)

    async def replace(pool: EndpointPool, http: httpx.AsyncClient) -> None:
        await until(lambda: server_of(pool, only.url).stats.inputs >= 20)
        pool.expect()
        only.stop()
        pool.lose(only.url)
        await asyncio.sleep(1.0)  # longer than down_grace: an expected replacement keeps the pool waiting
        assert not any(s.healthy for s in pool.servers)
        pool.add(Server(TeiClient(Endpoint(replacement.url), http, timeout=10.0), LIMITS))

    done = embed([only.url], texts, limits=LIMITS, down_grace=0.3, beside=replace)
    assert_all_embedded(done, texts)
    assert done.stats[replacement.url]["inputs"] > 0
    assert replacement.stats()["inputs_embedded"] + only.stats()["inputs_embedded"] >= len(texts)


def test_a_replacement_that_will_not_come_ends_the_wait(tei: Start) -> None:
    only = tei(**TINY, simulate_gpu=20_000.0, batch_overhead_s=0.01)

    async def give_up(pool: EndpointPool, http: httpx.AsyncClient) -> None:
        await until(lambda: server_of(pool, only.url).stats.inputs >= 20)
        pool.expect()
        only.stop()
        pool.lose(only.url)
        await asyncio.sleep(0.6)
        pool.unexpect()

    started = time.monotonic()
    with pytest.raises(CapacityUnavailable, match="taken back by the cloud"):
        embed([only.url], corpus(2000), limits=LIMITS, down_grace=0.3, beside=give_up)
    assert time.monotonic() - started < 10
