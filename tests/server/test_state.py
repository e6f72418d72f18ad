"""Per-input concurrency permits (429 at once, nothing taken) and the batch-size limit."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx

from teibatch.server.testing import running_server, server_stats

OVERLOADED = {"error": "Model is overloaded", "error_type": "Overloaded"}


def _wait_inflight(url: str, count: int, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while server_stats(url)["inflight_inputs"] != count:
        assert time.monotonic() < deadline, f"never saw {count} inputs in flight"
        time.sleep(0.01)


def test_permits_are_counted_per_input_and_refused_at_once() -> None:
    # 3 inputs of 3 tokens at 10 tokens/s: the first request holds 3 of 4 permits for ~0.9 s.
    with running_server(max_concurrent_requests=4, simulate_gpu=10.0, batch_overhead_s=0.0) as url, \
            ThreadPoolExecutor(1) as pool, httpx.Client(base_url=url, timeout=10) as c:
        slow = pool.submit(c.post, "/embed", json={"inputs": ["a", "b", "c"]})
        _wait_inflight(url, 3)
        started = time.monotonic()
        refused = c.post("/embed", json={"inputs": ["d", "e"]})
        assert time.monotonic() - started < 0.5  # no waiting for a permit
        assert (refused.status_code, refused.headers["content-type"], refused.json()) == (
            429, "application/json", OVERLOADED)
        assert server_stats(url)["inflight_inputs"] == 3  # the refused request took nothing
        assert slow.result(timeout=10).status_code == 200
        assert c.post("/embed", json={"inputs": ["d", "e"]}).status_code == 200
        stats = server_stats(url)
    assert stats["violations"]["inflight"] == 1
    assert stats["max_inflight_inputs"] == 3
    assert stats["inflight_inputs"] == 0


def test_openai_route_overloaded_shape() -> None:
    with running_server(max_concurrent_requests=1) as url:
        response = httpx.post(f"{url}/v1/embeddings", json={"input": ["a", "b"]})
    assert (response.status_code, response.json()) == (
        429, {"message": "Model is overloaded", "code": 429, "type": "Overloaded"})


def test_batch_size_is_checked_before_permits() -> None:
    with running_server(max_concurrent_requests=1, max_client_batch_size=2) as url:
        response = httpx.post(f"{url}/embed", json={"inputs": ["a", "b", "c"]})
        stats = server_stats(url)
    assert (response.status_code, response.json()) == (
        422, {"error": "batch size 3 > maximum allowed batch size 2", "error_type": "Validation"})
    assert stats["violations"] == {"batch_size": 1, "payload": 0, "inflight": 0, "input_length": 0}
    assert stats["max_inputs_per_request"] == 3


def test_a_client_within_limits_causes_no_violation() -> None:
    with running_server(max_client_batch_size=8, record_texts=True) as url, httpx.Client(base_url=url) as c:
        texts = [f"doc {i}" for i in range(20)]
        for start in range(0, 20, 8):
            assert c.post("/embed", json={"inputs": texts[start:start + 8]}).status_code == 200
        stats = server_stats(url)
    assert stats["violations"] == {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}
    assert stats["inputs_embedded"] == 20
    assert sum(stats["texts"].values()) == 20 and len(stats["texts"]) == 20
