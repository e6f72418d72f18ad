"""Tail hedging: once the caller says all work is in, idle servers take copies of the requests that would land last.

Against built-in servers, one of them slow: every text ends with its own vector, exactly one answer
is kept per text, no server's limits are broken (copies count in their server's budget, originals
are never cancelled), and every budget is whole again once the losing answers are back.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import httpx
import numpy as np

from teibatch.endpoint import Endpoint
from teibatch.server import HashingEmbedder, text_digest
from teibatch.tei import (
    ROUTE_EMBED,
    ClientLimits,
    EmbedOptions,
    EmbedRequest,
    EndpointPool,
    RequestPacker,
    Server,
    TeiClient,
    embed_texts,
)
from teibatch.tei.hedging import Flight, plan_copies
from tests.tei.conftest import EMBED_DEADLINE_S, ZERO_VIOLATIONS, ServerHandle, corpus

Start = Callable[..., ServerHandle]
LIMITS = {"max_client_batch_size": 8, "max_concurrent_requests": 32}
# The slow server embeds one request at a time, at 2,000 tokens/s: what it holds at the end takes
# a second or more, while the fast one answers in milliseconds.
SLOW = {**LIMITS, "simulate_gpu": 2_000.0, "max_batch_requests": 1}


def run_pool(urls: list[str], texts: list[str], *, all_work_in: bool) -> tuple[dict[str, dict[str, object]],
                                                                               np.ndarray, np.ndarray, list[int]]:
    """Embed ``texts`` over a fresh pool of ``urls``; then wait for the losing answers to come back.

    Returns the pool's stats, the vectors, which texts succeeded, and each server's inputs in flight
    once every request has landed.
    """

    async def main() -> tuple[dict[str, dict[str, object]], np.ndarray, np.ndarray, list[int]]:
        async with httpx.AsyncClient() as http:
            servers = []
            for url in urls:
                client = TeiClient(Endpoint(url), http, timeout=30.0)
                servers.append(Server(client, ClientLimits.derive(await client.info())))
            pool = EndpointPool(servers)
            if all_work_in:
                pool.all_work_in = lambda: True
            packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=pool.max_batch_size,
                                   payload_limit=pool.payload_limit)
            try:
                result = await asyncio.wait_for(embed_texts(pool, packer, texts, dimension=384), EMBED_DEADLINE_S)
                deadline = time.monotonic() + EMBED_DEADLINE_S
                while pool.flights and time.monotonic() < deadline:
                    await asyncio.sleep(0.02)
                in_flight = [s.in_flight for s in servers]
            finally:
                await pool.close()
            return pool.stats(), result.vectors, result.ok, in_flight

    return asyncio.run(main())


def test_idle_server_takes_copies_of_the_slow_servers_last_requests(tei: Start) -> None:
    slow = tei(**SLOW, record_texts=True)
    fast = tei(**LIMITS, record_texts=True)
    texts = corpus(400)
    stats, vectors, ok, in_flight = run_pool([slow.url, fast.url], texts, all_work_in=True)
    assert ok.all()
    np.testing.assert_array_equal(vectors, HashingEmbedder(384).embed(texts))
    assert int(stats[fast.url]["copies"]) > 0  # type: ignore[call-overload]
    assert int(stats[fast.url]["copies_won"]) > 0  # type: ignore[call-overload]
    assert in_flight == [0, 0]  # the slow server's own answers came back and freed its budget
    embedded: Counter[str] = Counter()
    for server in (slow, fast):
        server_side = server.stats()
        assert dict(server_side["violations"]) == ZERO_VIOLATIONS
        assert server_side["max_inflight_inputs"] <= LIMITS["max_concurrent_requests"]
        embedded.update(server_side["texts"])
    assert set(embedded) == {text_digest(t) for t in texts}
    assert max(embedded.values()) == 2  # a copy and its original: nothing more
    used = sum(int(s["inputs"]) for s in stats.values())  # type: ignore[call-overload]
    assert used == len(texts)  # a server's inputs are those its answers were used for
    assert sum(embedded.values()) > used  # the originals whose copies won were embedded too


def test_nothing_is_copied_until_the_caller_says_all_work_is_in(tei: Start) -> None:
    slow = tei(**SLOW, record_texts=True)
    fast = tei(**LIMITS, record_texts=True)
    texts = corpus(200)
    stats, _, ok, _ = run_pool([slow.url, fast.url], texts, all_work_in=False)
    assert ok.all()
    assert all(s["copies"] == 0 for s in stats.values())
    embedded = slow.stats()["texts"] + fast.stats()["texts"]
    assert embedded == Counter(text_digest(t) for t in texts)  # exactly once


def make_servers(count: int, *, batch: int = 8, inflight: int = 32, payload: int = 20_000) -> list[Server]:
    limits = ClientLimits(max_batch_size=batch, max_inflight_inputs=inflight, payload_limit=payload)
    http = httpx.AsyncClient()  # never used: the plan only reads limits and counts
    return [Server(TeiClient(Endpoint(f"http://127.0.0.1:{9 + i}"), http), limits) for i in range(count)]


def flights_on(server: Server, chars: list[int], first_order: int) -> list[Flight]:
    """Requests of 8 inputs with ``chars`` characters each, sent to ``server`` in order (its counts reserved)."""
    flights = []
    for offset, size in enumerate(chars):
        flight = Flight(server, EmbedRequest(ROUTE_EMBED, b"x" * 100, 8, size), first_order + offset,
                        copy_to=lambda _server: None)
        server.in_flight += 8
        server.requests_in_flight += 1
        flights.append(flight)
    return flights


def test_plan_copies_the_last_requests_of_the_busiest_server_to_the_idle_one() -> None:
    busy, idle = make_servers(2)
    queued = flights_on(busy, [1000, 1000, 1000, 1000], 1)
    copies = plan_copies([busy, idle], queued)
    # The last two land after 4,000 and 3,000 characters; their copies, answered together, after 2,000.
    # A third copy would make that batch 3,000 characters, later than its original (after 2,000).
    assert [(flight.order, target) for flight, target in copies] == [(4, idle), (3, idle)]


def test_plan_copies_the_last_request_even_when_its_own_batch_would_be_shorter() -> None:
    busy, idle = make_servers(2)
    queued = flights_on(busy, [1000, 300], 1)
    # Done before the original's 1,300 characters, though not before the busy server starts it.
    assert [(flight.order, target) for flight, target in plan_copies([busy, idle], queued)] == [(2, idle)]


def test_plan_copies_nothing_when_the_servers_would_finish_together() -> None:
    first, second = make_servers(2)
    flights = flights_on(first, [1000, 1000], 1) + flights_on(second, [1000, 1000], 3)
    assert plan_copies([first, second], flights) == []


def test_plan_copies_nothing_to_a_server_that_still_has_requests_of_its_own() -> None:
    # TEI would put the copy into the same batch as that server's own last requests, making them later.
    busy, short, idle = make_servers(3)
    flights = flights_on(busy, [1000] * 4, 1) + flights_on(short, [100], 5)
    assert plan_copies([busy, short], flights) == []
    assert {target for _, target in plan_copies([busy, short, idle], flights)} == {idle}


def test_plan_copies_nothing_of_a_request_first_in_line() -> None:
    busy, idle = make_servers(2)
    assert plan_copies([busy, idle], flights_on(busy, [1000], 1)) == []


def test_plan_copies_only_what_fits_the_other_server() -> None:
    busy, down = make_servers(2)
    small_batches, = make_servers(1, batch=4)
    small_bodies, = make_servers(1, payload=50)
    down.healthy = False
    queued = flights_on(busy, [1000] * 4, 1)
    assert plan_copies([busy, small_batches, small_bodies, down], queued) == []


def test_plan_copies_each_request_at_most_once_and_never_a_copy() -> None:
    busy, idle, other = make_servers(3)
    queued = flights_on(busy, [1000] * 4, 1)
    copy = Flight(other, queued[3].request, 5, twin=queued[3], is_copy=True)
    queued[3].twin = copy
    other.in_flight, other.requests_in_flight = 8, 1
    copies = plan_copies([busy, idle, other], [*queued, copy])
    # Order 4 has its copy already and the copy is never copied: the idle server takes order 3 (and
    # order 2 would be back after 2,000 characters, no sooner than its original).
    assert [(flight.order, target) for flight, target in copies] == [(3, idle)]
