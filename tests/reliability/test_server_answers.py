"""A real ``TeiClient`` over HTTP against misbehaving stand-ins: wrong 200s, deadlines, bad ``/info``.

Each test starts and stops its own stand-ins (:mod:`tests.reliability.standins`) and is bounded in
time: a hang is a failure, never a stuck suite.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import httpx
import numpy as np
import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import ServerFault, TeiUnavailable
from teibatch.tei import ROUTE_EMBED, ROUTE_OPENAI_BASE64, EmbedOptions, RequestPacker, ServerInfo, TeiClient
from teibatch.tei.checks import (
    FAULT_BAD_BODY,
    FAULT_NON_FINITE,
    FAULT_NOT_NORMALIZED,
    FAULT_WRONG_COUNT,
    FAULT_WRONG_DIMENSION,
)
from tests.reliability.standins import MISSING, Behaviour, StandIn, vector_for

T = TypeVar("T")
DIMENSION = 16
TEXTS = ["first text", "second, with é and \"quotes\"", "third\nline"]
MARGIN_S = 1.0
"""How much later than its deadline a timed-out request may end (scheduling on a loaded CI machine)."""
ROUTES = [pytest.param(ROUTE_EMBED, id="embed"), pytest.param(ROUTE_OPENAI_BASE64, id="base64")]

pytestmark = pytest.mark.timeout(30)


def run(work: Callable[[TeiClient], Awaitable[T]], url: str, *, timeout: float = 10.0,
        expected_dimension: int | None = DIMENSION, normalized: bool = True) -> T:
    """``work`` with a fresh client of ``url`` over a fresh ``httpx.AsyncClient``."""

    async def main() -> T:
        async with httpx.AsyncClient() as http:
            client = TeiClient(Endpoint(url), http, timeout=timeout, expected_dimension=expected_dimension,
                               normalized=normalized)
            return await asyncio.wait_for(work(client), 20)

    return asyncio.run(main())


def embedding(route: str = ROUTE_EMBED, texts: list[str] = TEXTS) -> Callable[[TeiClient], Awaitable[np.ndarray]]:
    """Work for :func:`run`: embed ``texts`` in one request on ``route``."""
    packer = RequestPacker(route, EmbedOptions(), max_batch_size=32, payload_limit=2_000_000)
    (batch,) = packer.pack(enumerate(texts))

    async def work(client: TeiClient) -> np.ndarray:
        return await client.embed(batch.request)

    return work


def expected(texts: list[str] = TEXTS) -> np.ndarray:
    return np.stack([vector_for(text, DIMENSION) for text in texts])


@pytest.mark.parametrize("route", ROUTES)
def test_a_healthy_stand_in_is_a_server_for_teibatch(route: str) -> None:
    with StandIn(dimension=DIMENSION) as server:
        vectors = run(embedding(route), server.url)
        stats = server.stats()
    np.testing.assert_array_equal(vectors, expected())
    assert stats.requests == {"/v1/embeddings" if route == ROUTE_OPENAI_BASE64 else "/embed": 1}
    assert stats.texts == TEXTS and stats.max_inputs_in_flight == 3 and stats.inputs_in_flight == 0


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(("behaviour", "kind", "message"), [
    pytest.param(Behaviour.WRONG_DIMENSION, FAULT_WRONG_DIMENSION, "answered 8-dimension vectors, expected 16",
                 id="wrong-dimension"),
    pytest.param(Behaviour.WRONG_COUNT, FAULT_WRONG_COUNT, "answered 2 vectors for 3 inputs", id="wrong-count"),
    pytest.param(Behaviour.NON_FINITE, FAULT_NON_FINITE, "1 of 3 vectors with NaN or infinite values "
                 r"\(the first for input 0\)", id="non-finite"),
    pytest.param(Behaviour.NOT_NORMALIZED, FAULT_NOT_NORMALIZED, "3 of 3 vectors that are not normalized.*"
                 "L2 norm 3", id="not-normalized"),
    pytest.param(Behaviour.HTML_200, FAULT_BAD_BODY, "not its JSON.*body starts '<html>", id="html-200"),
    pytest.param(Behaviour.EMPTY_200, FAULT_BAD_BODY, r"not its JSON.*body starts '' \(empty\)", id="empty-200"),
])
def test_a_wrong_200_is_a_server_fault_of_its_kind(route: str, behaviour: Behaviour, kind: str,
                                                   message: str) -> None:
    with StandIn(behaviour, dimension=DIMENSION) as server, pytest.raises(ServerFault, match=message) as caught:
        run(embedding(route), server.url)
    fault = caught.value
    assert (fault.kind, fault.server, fault.status_code) == (kind, server.url, 200)
    assert isinstance(fault, TeiUnavailable) and fault.retryable
    assert str(fault).startswith(f"{server.url}: answered ")


def test_dimension_and_norm_are_checked_only_when_asked() -> None:
    with StandIn(Behaviour.WRONG_DIMENSION, dimension=DIMENSION) as server:
        loose = run(embedding(), server.url, expected_dimension=None)
        server.behave(Behaviour.NOT_NORMALIZED)
        raw = run(embedding(), server.url, normalized=False)
    assert loose.shape == (3, DIMENSION // 2)
    np.testing.assert_allclose(np.linalg.norm(raw, axis=1), 3.0, rtol=1e-5)


def test_a_proxys_502_page_is_unavailable_not_a_fault() -> None:
    with StandIn(Behaviour.HTML_502, dimension=DIMENSION) as server, pytest.raises(TeiUnavailable) as caught:
        run(embedding(), server.url)
    assert not isinstance(caught.value, ServerFault)
    assert caught.value.status_code == 502 and "502 Bad Gateway" in str(caught.value)


def test_a_server_fixed_at_run_time_answers_right_to_the_same_client() -> None:
    with StandIn(Behaviour.NON_FINITE, dimension=DIMENSION) as server:
        embed = embedding(ROUTE_OPENAI_BASE64)

        async def work(client: TeiClient) -> tuple[str, np.ndarray]:
            try:
                await embed(client)
            except ServerFault as fault:
                kind = fault.kind
            server.behave(Behaviour.HEALTHY)
            return kind, await embed(client)

        kind, vectors = run(work, server.url)
        assert server.stats().requests["/v1/embeddings"] == 2
    assert kind == FAULT_NON_FINITE
    np.testing.assert_array_equal(vectors, expected())


def open_connections_drop_to_zero(server: StandIn, within: float = 2.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if server.stats().open_connections == 0:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.parametrize("behaviour", [
    pytest.param(Behaviour.HANG, id="never-answers"),
    pytest.param(Behaviour.TRICKLE, id="trickles-50-bytes-a-second"),
])
def test_every_request_ends_by_its_deadline_and_closes_its_connection(behaviour: Behaviour) -> None:
    timeout = 0.8
    with StandIn(behaviour, dimension=DIMENSION, trickle_bytes_per_s=50) as server:

        async def work(client: TeiClient) -> tuple[float, TeiUnavailable, bool, bool, np.ndarray]:
            started = time.monotonic()
            with pytest.raises(TeiUnavailable) as caught:
                await embedding()(client)
            took = time.monotonic() - started
            # Still inside the httpx client: the timed-out connection must be closed, not pooled.
            closed = await asyncio.to_thread(open_connections_drop_to_zero, server)
            healthy = await client.healthy()
            server.behave(Behaviour.HEALTHY)
            return took, caught.value, closed, healthy, await embedding()(client)

        took, error, closed, healthy, vectors = run(work, server.url, timeout=timeout)
        stats = server.stats()
    assert timeout <= took < timeout + MARGIN_S
    assert type(error) is TeiUnavailable and error.status_code is None and error.retryable
    assert str(error).startswith(f"{server.url}: no complete answer within 0.8s to POST /embed")
    assert closed and healthy
    np.testing.assert_array_equal(vectors, expected())
    assert stats.requests["/embed"] == 2 and stats.inputs_in_flight == 0


def test_a_trickle_would_outlast_every_read_timeout() -> None:
    """The case the whole-request deadline is for: each read gets bytes well within httpx's per-read
    timeout, yet the answer would take minutes. Measured here with httpx alone, for a few seconds."""
    with StandIn(Behaviour.TRICKLE, dimension=DIMENSION, trickle_bytes_per_s=50) as server:

        async def main() -> float:
            started = time.monotonic()
            async with httpx.AsyncClient(timeout=0.8) as http:
                with pytest.raises(TimeoutError):
                    async with asyncio.timeout(3.0):
                        await http.post(server.url + "/embed", json={"inputs": TEXTS})
            return time.monotonic() - started

        took = asyncio.run(main())
    assert took >= 3.0  # httpx's 0.8 s timeouts never fired; only the outer deadline did


def info_of(server: StandIn) -> ServerInfo:
    async def work(client: TeiClient) -> ServerInfo:
        return await client.info()

    return run(work, server.url)


@pytest.mark.parametrize(("key", "value", "used"), [
    pytest.param("max_client_batch_size", 0, 1, id="batch-0"),
    pytest.param("max_client_batch_size", -4, 1, id="batch-negative"),
    pytest.param("max_client_batch_size", None, 1, id="batch-null"),
    pytest.param("max_client_batch_size", "32", 1, id="batch-string"),
    pytest.param("max_client_batch_size", 32.0, 1, id="batch-float"),
    pytest.param("max_client_batch_size", True, 1, id="batch-bool"),
    pytest.param("max_client_batch_size", MISSING, 32, id="batch-missing"),
    pytest.param("max_concurrent_requests", 0, 32, id="inflight-0"),
    pytest.param("max_concurrent_requests", MISSING, 512, id="inflight-missing"),
    pytest.param("max_input_length", "8192", 512, id="length-string"),
    pytest.param("max_batch_tokens", None, 16384, id="batch-tokens-null"),
    pytest.param("max_batch_requests", 0, None, id="batch-requests-0"),
])
def test_bad_info_limits_are_replaced_and_logged(caplog: pytest.LogCaptureFixture, key: str, value: Any,
                                                 used: int | None) -> None:
    with StandIn(info={key: value}) as server, caplog.at_level(logging.WARNING, logger="teibatch.tei.info"):
        info = info_of(server)
    assert getattr(info, key) == used
    seen = "missing" if value is MISSING else {None: "null", True: "true"}.get(value, repr(value).replace("'", '"'))
    shown_used = "null" if used is None else str(used)
    assert info.replaced == {key: f"{seen} -> {shown_used}"}
    (record,) = [r for r in caplog.records if r.name == "teibatch.tei.info"]
    assert record.getMessage().startswith(f"{server.url}: /info {key} is {seen}; using {shown_used} (")


def test_a_sound_info_replaces_nothing_and_logs_nothing(caplog: pytest.LogCaptureFixture) -> None:
    with StandIn() as server, caplog.at_level(logging.WARNING, logger="teibatch.tei.info"):
        info = info_of(server)
    assert (info.max_client_batch_size, info.max_concurrent_requests, info.replaced) == (32, 512, {})
    assert [r for r in caplog.records if r.name == "teibatch.tei.info"] == []


def test_an_unknown_auto_truncate_keeps_the_client_off_the_base64_route(caplog: pytest.LogCaptureFixture) -> None:
    with StandIn(info={"auto_truncate": "true"}) as server, caplog.at_level(logging.WARNING):
        info = info_of(server)
    assert info.auto_truncate is False and info.supports_base64 is False
    assert info.replaced == {"auto_truncate": '"true" -> false'}
    assert "auto_truncate" in caplog.text


def test_stopping_a_stand_in_ends_a_hung_answer_at_once() -> None:
    server = StandIn(Behaviour.HANG).start()
    stopper = threading.Timer(0.3, server.stop)

    async def work(client: TeiClient) -> float:
        started = time.monotonic()
        stopper.start()
        with pytest.raises(TeiUnavailable, match="connection failed"):
            await embedding()(client)
        return time.monotonic() - started

    try:
        took = run(work, server.url, timeout=10.0)
    finally:
        stopper.join()
        server.stop()
    assert 0.3 <= took < 0.3 + MARGIN_S
