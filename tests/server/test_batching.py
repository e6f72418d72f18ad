"""The queue packs inputs from all requests up to max_batch_tokens; the capacity model paces batches."""

from __future__ import annotations

import asyncio
import time

import httpx
import numpy as np
import pytest

from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.batching import BatchQueue
from teibatch.server.config import ServerConfig
from teibatch.server.metrics import IDLE_GAPS_KEPT, Metrics


async def _run(config: ServerConfig, requests: list[list[str]], backend: object = None) -> tuple[Metrics, float]:
    metrics = Metrics()
    queue = BatchQueue(backend or HashingEmbedder(16), config, metrics)  # type: ignore[arg-type]
    queue.start()
    started = time.perf_counter()
    try:
        submitted = [queue.submit("embed", texts, [5] * len(texts)) for texts in requests]
        await asyncio.wait_for(asyncio.gather(*(request.future for request in submitted)), 10)
    finally:
        await queue.stop()
    return metrics, time.perf_counter() - started


def test_inputs_of_many_requests_share_batches_up_to_max_batch_tokens() -> None:
    config = ServerConfig(max_batch_tokens=20, max_input_length=20)
    metrics, _ = asyncio.run(_run(config, [["a"] * 3, ["b"] * 3, ["c"] * 3]))
    # 9 inputs of 5 tokens, 4 per batch -> 3 batches (4, 4, 1).
    assert metrics.batches == 3
    sizes = metrics.histograms["te_batch_next_size"][()]
    assert (sizes.count, sizes.sum) == (3, 9)


def test_max_batch_requests_caps_a_batch() -> None:
    metrics, _ = asyncio.run(_run(ServerConfig(max_batch_requests=2), [["a"] * 5]))
    assert metrics.batches == 3


def test_capacity_model_paces_batches() -> None:
    # 4 batches of 4 x 5 tokens at 400 tokens/s + 10 ms overhead = 4 x 60 ms.
    config = ServerConfig(max_batch_tokens=20, max_input_length=20, simulate_gpu=400.0, batch_overhead_s=0.01)
    _, elapsed = asyncio.run(_run(config, [["a"] * 16]))
    assert 0.23 <= elapsed < 1.5


def test_a_busy_event_loop_does_not_slow_the_simulated_gpu() -> None:
    # 6 batches of 4 x 5 tokens at 100 tokens/s = 6 x 200 ms of model time, all queued at once, while
    # another task holds the loop 15 ms at a time: on the simulated GPU's own clock each batch
    # starts as the one before ends and takes exactly its model time; only the answers wait. (Each
    # batch's model time is far above what computing it takes, even on a busy machine.)
    config = ServerConfig(max_batch_tokens=20, max_input_length=20, simulate_gpu=100.0, batch_overhead_s=0.0)

    async def with_a_hog() -> tuple[Metrics, float]:
        async def hog() -> None:
            for _ in range(800):  # bounded: 12 s at most
                time.sleep(0.015)
                await asyncio.sleep(0)

        hogging = asyncio.get_running_loop().create_task(hog())
        try:
            return await _run(config, [["a"] * 24])
        finally:
            hogging.cancel()

    metrics, elapsed = asyncio.run(with_a_hog())
    assert metrics.batches == 6
    assert metrics.busy_seconds == pytest.approx(1.2, abs=1e-6)
    assert metrics.last_batch_finished - metrics.first_batch_started == pytest.approx(1.2, abs=1e-6)
    assert metrics.idle_gaps == []
    assert elapsed >= 1.2


def test_a_simulated_gpu_batch_takes_only_inputs_queued_when_it_started() -> None:
    # One input, then 30 ms later (while the first batch of 500 ms runs: room for a busy machine) three
    # more: the second batch starts when the first ends, on the GPU's clock, and takes the three; none
    # ran before it was queued.
    config = ServerConfig(max_batch_tokens=20, max_input_length=20, simulate_gpu=10.0, batch_overhead_s=0.0)

    async def staggered() -> tuple[Metrics, list[object]]:
        metrics = Metrics()
        queue = BatchQueue(HashingEmbedder(16), config, metrics)
        queue.start()
        try:
            first = queue.submit("embed", ["a"], [5])
            await asyncio.sleep(0.03)
            later = queue.submit("embed", ["b", "c", "d"], [5, 5, 5])
            await asyncio.wait_for(asyncio.gather(first.future, later.future), 10)
        finally:
            await queue.stop()
        return metrics, first.jobs + later.jobs

    metrics, jobs = asyncio.run(staggered())
    assert metrics.batches == 2
    for job in jobs:
        assert job.enqueued <= job.started < job.finished  # type: ignore[attr-defined]
    assert jobs[1].started == pytest.approx(jobs[0].finished, abs=1e-9)  # type: ignore[attr-defined]


class _Broken:
    dimension, heavy = 4, False
    tokenizer = HashingEmbedder(4).tokenizer

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        raise RuntimeError("CUDA error: device-side assert triggered")


class _Recording:
    """The hashing model, keeping every text it embedded."""

    dimension, heavy = 16, False
    tokenizer = HashingEmbedder(16).tokenizer

    def __init__(self) -> None:
        self.texts: list[str] = []

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        self.texts += texts
        return HashingEmbedder(16).embed(texts, normalize)


def test_the_inputs_of_a_request_whose_client_went_away_are_dropped_not_embedded() -> None:
    config = ServerConfig(max_batch_tokens=20, max_input_length=20, simulate_gpu=400.0, batch_overhead_s=0.0)
    backend = _Recording()

    async def scenario() -> Metrics:
        metrics = Metrics()
        queue = BatchQueue(backend, config, metrics)  # type: ignore[arg-type]
        queue.start()
        try:
            first = queue.submit("embed", ["a"] * 4, [5] * 4)  # one batch of 50 ms
            gone = queue.submit("embed", ["b"] * 3, [5] * 3)
            after = queue.submit("embed", ["c"], [5])
            gone.future.cancel()
            await asyncio.wait_for(asyncio.gather(first.future, after.future), 10)
        finally:
            await queue.stop()
        return metrics

    metrics = asyncio.run(scenario())
    assert backend.texts == ["a"] * 4 + ["c"]
    assert 'te_request_failure{err="dropped"} 3' in metrics.render()


def test_a_backend_failure_fails_every_input_of_the_batch() -> None:
    from teibatch.server.responses import ApiError

    with pytest.raises(ApiError) as caught:
        asyncio.run(_run(ServerConfig(), [["a", "b"]], backend=_Broken()))
    assert (caught.value.status, caught.value.error_type, caught.value.message) == (
        424, "Backend", "Backend error: CUDA error: device-side assert triggered")


def test_queue_size_metric_shows_waiting_inputs() -> None:
    from teibatch.server.testing import running_server

    with running_server(simulate_gpu=200.0, max_batch_tokens=10, batch_overhead_s=0.0) as url, \
            httpx.Client(base_url=url, timeout=10) as c:
        import threading

        thread = threading.Thread(target=c.post, args=("/embed",), kwargs={"json": {"inputs": ["a"] * 8}})
        thread.start()
        seen = 0
        deadline = time.monotonic() + 3
        while time.monotonic() < deadline and not seen:
            for line in c.get("/metrics").text.splitlines():
                if line.startswith("te_queue_size "):
                    seen = int(float(line.split()[1]))
            time.sleep(0.01)
        thread.join(10)
    assert seen > 0


def test_stats_list_the_longest_idle_waits_between_batches() -> None:
    metrics = Metrics()
    assert metrics.stats(inflight_inputs=0, queue_size=0)["longest_idle_gaps"] == []
    # Batches at 10-11, 11-12 (no wait), 12.5-13, 20-21, then six more each after a wait of 0.1 s.
    for started, finished in [(10, 11), (11, 12), (12.5, 13), (20, 21)] + [(21.1 + i, 22 + i) for i in range(6)]:
        metrics.model_busy(started, finished)
    stats = metrics.stats(inflight_inputs=0, queue_size=0)
    gaps = stats["longest_idle_gaps"]
    assert len(gaps) == IDLE_GAPS_KEPT
    assert [g["seconds"] for g in gaps[:2]] == [7.0, 0.5]
    assert [g["after_first_batch_s"] for g in gaps[:2]] == [3.0, 2.0]
    assert all(abs(g["seconds"] - 0.1) < 1e-9 for g in gaps[2:])
    assert stats["model_busy_seconds"] == 3.5 + 6 * 0.9
    assert stats["serving_span_seconds"] == 17.0


def test_stats_give_the_server_process_s_own_cpu_time() -> None:
    metrics = Metrics()
    before = metrics.stats(inflight_inputs=0, queue_size=0)["process_cpu_seconds"]
    deadline = time.process_time() + 0.05
    while time.process_time() < deadline:
        pass
    after = metrics.stats(inflight_inputs=0, queue_size=0)["process_cpu_seconds"]
    assert isinstance(before, float) and after >= before + 0.04
