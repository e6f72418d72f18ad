"""Fault injection: each fault answers as documented, is counted, and is repeatable for a seed."""

from __future__ import annotations

import time

import httpx
import pytest

from teibatch.server.testing import running_server, server_stats

EMBED = {"inputs": ["a", "b"]}


@pytest.mark.parametrize("fault, status, content_type, body", [
    pytest.param("rate_429", 429, "application/json",
                 b'{"error":"Model is overloaded","error_type":"Overloaded"}', id="429"),
    pytest.param("rate_503", 503, "application/json", b'{"error":"unhealthy","error_type":"Unhealthy"}', id="503"),
    pytest.param("rate_424", 424, "application/json",
                 b'{"error":"Backend error: CUDA error: out of memory (injected by teibatch)",'
                 b'"error_type":"Backend"}', id="424"),
    pytest.param("rate_500", 500, "text/plain; charset=utf-8", b"Internal Server Error", id="500"),
])
def test_error_faults(fault: str, status: int, content_type: str, body: bytes) -> None:
    with running_server(faults={fault: 1.0}) as url:
        response = httpx.post(f"{url}/embed", json=EMBED)
        assert httpx.get(f"{url}/health").status_code == 200  # only inference routes get faults
        stats = server_stats(url)
    assert (response.status_code, response.headers["content-type"], response.content) == (
        status, content_type, body)
    assert stats["faults"][status.__str__()] == 1
    assert stats["violations"]["inflight"] == 0


def test_openai_route_gets_openai_shaped_faults() -> None:
    with running_server(faults={"rate_503": 1.0}) as url:
        response = httpx.post(f"{url}/v1/embeddings", json={"input": "a"})
    assert response.json() == {"message": "unhealthy", "code": 503, "type": "Unhealthy"}


def test_drop_cuts_the_connection_mid_response() -> None:
    with running_server(faults={"rate_drop": 1.0}) as url:
        with pytest.raises(httpx.TransportError):
            httpx.post(f"{url}/embed", json=EMBED, timeout=5)
        stats = server_stats(url)
    assert stats["faults"]["drop"] == 1


def test_latency_spike() -> None:
    with running_server(faults={"rate_latency": 1.0, "latency_s": 0.2}) as url:
        started = time.monotonic()
        assert httpx.post(f"{url}/embed", json=EMBED).status_code == 200
        assert time.monotonic() - started >= 0.2
        assert server_stats(url)["faults"]["latency"] == 1


def test_hang_after() -> None:
    with running_server(faults={"hang_after": 1}) as url:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(f"{url}/embed", json=EMBED, timeout=0.3)
        assert httpx.post(f"{url}/embed", json=EMBED).status_code == 200
        assert server_stats(url)["faults"]["hang"] == 1


def test_exit_after_stops_the_server() -> None:
    with running_server(faults={"exit_after": 2}) as url:
        assert httpx.post(f"{url}/embed", json=EMBED).status_code == 200
        assert httpx.post(f"{url}/embed", json=EMBED).status_code == 200
        deadline = time.monotonic() + 5
        while True:
            try:
                httpx.get(f"{url}/health", timeout=1)
            except httpx.TransportError:
                break
            assert time.monotonic() < deadline, "the server kept running"
            time.sleep(0.02)


def _statuses(seed: int) -> list[int]:
    with running_server(faults={"seed": seed, "rate_429": 0.3, "rate_503": 0.2}) as url, \
            httpx.Client(base_url=url) as c:
        return [c.post("/embed", json={"inputs": "x"}).status_code for _ in range(20)]


def test_faults_are_repeatable_for_a_seed() -> None:
    first = _statuses(7)
    assert first == _statuses(7)
    assert {200, 429, 503} <= set(first)


@pytest.mark.parametrize(("tokenize", "status"), [
    pytest.param(False, 200, id="inference-only"),
    pytest.param(True, 429, id="tokenize-too"),
])
def test_tokenize_gets_faults_only_when_asked(tokenize: bool, status: int) -> None:
    with running_server(faults={"rate_429": 1.0, "tokenize": tokenize}) as url:
        response = httpx.post(f"{url}/tokenize", json={"inputs": "a b"})
        assert httpx.post(f"{url}/embed", json=EMBED).status_code == 429
        stats = server_stats(url)
    assert response.status_code == status
    assert stats["faults"]["429"] == 1 + tokenize
