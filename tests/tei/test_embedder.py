"""``embed_texts`` against built-in servers with tiny limits and injected faults.

Every test checks what the servers counted: each text embedded (exactly once where no answer can
be lost), no limit broken, and the vector for each text equal to what the server computes for it.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

import httpx
import numpy as np
import pytest

from teibatch.errors import CapacityUnavailable, TeiAuthError, TeiOverloaded, WrongModelKind
from teibatch.server import HashingEmbedder, text_digest
from teibatch.server.tokens import ApproxTokenizer
from teibatch.sparse import SparseVector
from teibatch.tei import (
    ROUTE_EMBED,
    ROUTE_EMBED_SPARSE,
    ROUTE_OPENAI_BASE64,
    ClientLimits,
    EmbedOptions,
    EmbedResult,
    Failure,
)
from teibatch.tei.embedder import MAX_OVERLOAD_RETRIES
from teibatch.tei.pool import EndpointPool
from teibatch.tei.work import FAILURE_EMBED, FAILURE_REFUSED, FAILURE_TOO_LONG
from tests.tei.conftest import TINY, ZERO_VIOLATIONS, Embedded, ServerHandle, corpus, embed, when

Start = Callable[..., ServerHandle]
LIMITS = ClientLimits(max_batch_size=4, max_inflight_inputs=8, payload_limit=20_000)


def assert_all_embedded(done: Embedded, texts: list[str]) -> None:
    assert done.result.failures == []
    assert done.result.ok.all()
    np.testing.assert_array_equal(done.result.vectors, HashingEmbedder(384).embed(texts))


def assert_within_limits(*servers: ServerHandle) -> Counter[str]:
    """Every server's violation counters are zero and its limits held; the texts they embedded."""
    texts: Counter[str] = Counter()
    for server in servers:
        stats = server.stats()
        assert dict(stats["violations"]) == ZERO_VIOLATIONS
        assert stats["max_inputs_per_request"] <= TINY["max_client_batch_size"]
        assert stats["max_body_bytes"] <= TINY["payload_limit"]
        assert stats["max_inflight_inputs"] <= TINY["max_concurrent_requests"]
        texts.update(stats["texts"])
    return texts


@pytest.mark.parametrize("route", [pytest.param(ROUTE_EMBED, id="embed"),
                                   pytest.param(ROUTE_OPENAI_BASE64, id="openai-base64")])
def test_tiny_limits_every_text_once_with_its_vector(tei: Start, route: str) -> None:
    servers = [tei(**TINY, api_key="k", record_texts=True) for _ in range(2)]
    texts = corpus(300)
    done = embed([s.url for s in servers], texts, key="k", route=route)
    assert_all_embedded(done, texts)
    embedded = assert_within_limits(*servers)
    assert embedded == Counter(text_digest(t) for t in texts)  # exactly once, over both servers
    assert all(s["inputs"] > 50 for s in done.stats.values())  # both servers worked


def test_sparse_vectors_keep_the_same_limits_and_come_back_at_their_texts(tei: Start) -> None:
    servers = [tei(**TINY, pooling="splade", api_key="k", record_texts=True) for _ in range(2)]
    texts = corpus(200)
    texts[7] = ""  # refused alone, as on /embed
    done = embed([s.url for s in servers], texts, key="k", route=ROUTE_EMBED_SPARSE)
    assert [(f.position, f.reason) for f in done.result.failures] == [(7, "empty_text")]
    want = HashingEmbedder(384).embed_sparse(texts)
    for position, (indices, values) in enumerate(want):
        if position != 7:
            assert done.result.vectors[position] == SparseVector(indices.astype(np.int32), values)
    embedded = assert_within_limits(*servers)
    assert embedded == Counter(text_digest(t) for t in texts if t)  # exactly once, over both servers
    assert all(s["inputs"] > 50 for s in done.stats.values())


def test_429_503_500_are_resent_and_nothing_is_embedded_twice(tei: Start) -> None:
    faults = {"fault_rate_429": 0.15, "fault_rate_503": 0.05, "fault_rate_500": 0.05, "fault_rate_424": 0.05}
    servers = [tei(**TINY, record_texts=True, fault_seed=seed, **faults) for seed in (1, 2)]
    texts = corpus(400)
    done = embed([s.url for s in servers], texts)
    assert_all_embedded(done, texts)
    assert assert_within_limits(*servers) == Counter(text_digest(t) for t in texts)
    injected = sum((s.stats()["faults"] for s in servers), Counter())
    assert injected["429"] > 0 and injected["503"] + injected["500"] + injected["424"] > 0
    assert sum(int(s["window_decreases"]) for s in done.stats.values()) > 0  # 429s shrank the windows
    assert sum(int(s["retries"]) for s in done.stats.values()) >= sum(injected.values()) - injected["latency"]


def test_the_caller_hears_when_every_text_is_out_before_the_answers_are_in(tei: Start) -> None:
    # A sender gives a chunk's admission slot up then (pipeline/admission.py). Said once, even though
    # 429s and 503s put texts back to be sent again after it was said.
    servers = [tei(**TINY, record_texts=True, fault_seed=seed, fault_rate_429=0.15, fault_rate_503=0.1,
                   simulate_gpu=5_000) for seed in (1, 2)]
    texts = corpus(200)
    pools: list[EndpointPool] = []
    in_flight_when_said: list[int] = []

    async def keep_pool(pool: EndpointPool, _: httpx.AsyncClient) -> None:
        pools.append(pool)

    def said() -> None:
        in_flight_when_said.append(sum(server.in_flight for server in pools[0].servers))

    done = embed([s.url for s in servers], texts, beside=keep_pool, all_sent=said)
    assert_all_embedded(done, texts)
    assert len(in_flight_when_said) == 1 and in_flight_when_said[0] > 0
    assert sum(int(s["retries"]) for s in done.stats.values()) > 0


def test_dropped_connections_and_a_hung_request_are_resent(tei: Start) -> None:
    servers = [tei(**TINY, record_texts=True, fault_seed=3, fault_rate_drop=0.1, fault_hang_after=5),
               tei(**TINY, record_texts=True, fault_seed=4, fault_rate_drop=0.1)]
    texts = corpus(300)
    done = embed([s.url for s in servers], texts, timeout=0.5)
    assert_all_embedded(done, texts)
    embedded = assert_within_limits(*servers)
    # A dropped answer was computed before it was lost: the server saw those texts twice.
    assert set(embedded) == {text_digest(t) for t in texts}
    assert servers[0].stats()["faults"]["hang"] == 1


def test_a_failing_request_goes_to_another_server(tei: Start) -> None:
    broken = tei(**TINY, record_texts=True, fault_rate_503=1.0)
    good = tei(**TINY, record_texts=True)
    texts = corpus(120)
    done = embed([broken.url, good.url], texts)
    assert_all_embedded(done, texts)
    assert good.stats()["texts"] == Counter(text_digest(t) for t in texts)
    assert done.stats[broken.url]["inputs"] == 0
    assert int(done.stats[broken.url]["marked_down"]) >= 1


def test_server_killed_mid_run_and_another_restarted(tei: Start) -> None:
    slow = {**TINY, "record_texts": True, "simulate_gpu": 20_000.0, "batch_overhead_s": 0.02}
    doomed, flaky, steady = tei(**slow), tei(**slow), tei(**slow)
    texts = corpus(800)
    kill = when(lambda: doomed.stats()["inputs_embedded"] >= 60, doomed.stop)

    def bounce() -> None:
        flaky.stop()
        time.sleep(0.3)
        flaky.start()

    restart = when(lambda: flaky.stats()["inputs_embedded"] >= 60, bounce)
    done = embed([doomed.url, flaky.url, steady.url], texts)
    kill.join(5)
    restart.join(5)
    assert_all_embedded(done, texts)
    embedded = assert_within_limits(doomed, flaky, steady)
    # A stopped server may have computed answers that never reached the client: texts seen twice.
    assert set(embedded) == {text_digest(t) for t in texts}
    assert len(flaky.generations) == 1 and flaky.stats()["inputs_embedded"] > flaky.generations[0]["inputs_embedded"]
    assert int(done.stats[doomed.url]["marked_down"]) == 1
    assert int(done.stats[flaky.url]["marked_down"]) >= 1


def test_no_server_left_stops_cleanly(tei: Start) -> None:
    only = tei(**TINY, simulate_gpu=20_000.0, batch_overhead_s=0.01)
    when(lambda: only.stats()["inputs_embedded"] >= 20, only.stop)
    started = time.monotonic()
    with pytest.raises(CapacityUnavailable, match="resumes") as caught:
        embed([only.url], corpus(2000), down_grace=0.5)
    assert caught.value.exit_code == 1
    assert time.monotonic() - started < 15


def test_one_long_text_is_bisected_out_and_rejected(tei: Start) -> None:
    server = tei(**TINY, max_input_length=64, record_texts=True)
    texts = corpus(40)
    texts[13] = "word " * 300
    done = embed([server.url], texts, options=EmbedOptions(truncate=False))
    (failure,) = done.result.failures
    assert (failure.position, failure.reason) == (13, "input_too_long")
    assert "must have less than 64 tokens" in failure.detail
    ok = [i for i in range(40) if i != 13]
    assert done.result.ok.sum() == 39 and not done.result.ok[13]
    np.testing.assert_array_equal(done.result.vectors[ok], HashingEmbedder(384).embed([texts[i] for i in ok]))
    stats = server.stats()
    # Its batch of 4 was bisected: 4 → 2 → 1, one refused request at each level.
    assert stats["violations"]["input_length"] == 3
    assert stats["texts"] == Counter(text_digest(texts[i]) for i in ok)


def test_too_long_text_is_resent_truncated_when_the_job_asks(tei: Start) -> None:
    server = tei(**TINY, max_input_length=64)
    texts = corpus(10)
    texts[3] = "long " * 300
    done = embed([server.url], texts, options=EmbedOptions(truncate=False, on_too_long="truncate"))
    assert done.result.failures == [] and done.result.ok.all()
    assert done.result.truncated.tolist() == [i == 3 for i in range(10)]
    cut = ApproxTokenizer().truncate(texts[3], 64, "right")
    np.testing.assert_array_equal(done.result.vectors[3], HashingEmbedder(384).embed([cut])[0])


@pytest.mark.parametrize("direction", ["right", "left"])
def test_text_over_the_payload_limit_is_cut_to_fit_and_flagged(tei: Start, direction: str) -> None:
    server = tei(**TINY, record_texts=True)
    texts = corpus(8)
    texts[5] = "start " + "abcd " * 8_000 + " end"  # 40 KB, twice the body limit
    done = embed([server.url], texts, options=EmbedOptions(truncation_direction=direction))
    assert done.result.ok.all()
    assert done.result.truncated.tolist() == [i == 5 for i in range(8)]
    # The cut keeps far more than max_input_length tokens: the vector is TEI's own truncation's.
    want = ApproxTokenizer().truncate(texts[5], 512, direction)
    np.testing.assert_array_equal(done.result.vectors[5], HashingEmbedder(384).embed([want])[0])
    assert dict(server.stats()["violations"]) == ZERO_VIOLATIONS


def test_text_over_the_payload_limit_is_rejected_without_truncation(tei: Start) -> None:
    server = tei(**TINY, record_texts=True)
    texts = ["short one", "x" * 30_000, "short two"]
    done = embed([server.url], texts, options=EmbedOptions(truncate=False))
    assert [(f.position, f.reason) for f in done.result.failures] == [(1, "payload_too_large")]
    assert server.stats()["texts"] == Counter(text_digest(t) for t in ("short one", "short two"))


def test_empty_text_is_rejected_without_a_request(tei: Start) -> None:
    server = tei(**TINY, record_texts=True)
    done = embed([server.url], ["a", "", "b"])
    assert [(f.position, f.reason) for f in done.result.failures] == [(1, "empty_text")]
    assert server.stats()["requests"] == 1


def test_a_text_that_keeps_failing_is_rejected_after_bounded_retries(tei: Start) -> None:
    server = tei(**TINY, fault_rate_500=1.0)
    started = time.monotonic()
    done = embed([server.url], corpus(6), max_retries=2)
    assert [f.reason for f in done.result.failures] == ["embed_failed"] * 6
    assert all("Internal Server Error" in f.detail for f in done.result.failures)
    assert time.monotonic() - started < 20
    # 2 requests of 3..4 texts, each tried 3 times, then halves and single texts 3 times each.
    assert server.stats()["requests"] <= 3 * (2 + 4 + 6)


def test_overload_that_never_ends_propagates(tei: Start, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("teibatch.tei.embedder.MAX_OVERLOAD_RETRIES", 3)
    monkeypatch.setattr("teibatch.tei.embedder._BACKOFF_BASE_S", 0.001)
    server = tei(**TINY, fault_rate_429=1.0)
    with pytest.raises(TeiOverloaded):
        embed([server.url], corpus(4))
    assert server.stats()["requests"] == 4 and MAX_OVERLOAD_RETRIES > 3


class SlowerAfter(httpx.AsyncBaseTransport):
    """The real transport, but every embed request after the first ``after`` takes longer: ``delay`` s, or
    ten times the first requests' mean latency when that is more (a loaded machine's baseline is slow too)."""

    def __init__(self, after: int, delay: float) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.after, self.delay, self.seen = after, delay, 0
        self.baseline: list[float] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path != "/embed":
            return await self.inner.handle_async_request(request)
        self.seen += 1
        if self.seen > self.after:
            mean = sum(self.baseline) / len(self.baseline) if self.baseline else 0.0
            await asyncio.sleep(max(self.delay, 10 * mean))
            return await self.inner.handle_async_request(request)
        began = time.monotonic()
        answer = await self.inner.handle_async_request(request)
        await answer.aread()
        self.baseline.append(time.monotonic() - began)
        return answer

    async def aclose(self) -> None:
        await self.inner.aclose()


def test_latency_growth_shrinks_the_window(tei: Start) -> None:
    server = tei(max_client_batch_size=4, max_concurrent_requests=64, record_texts=True)
    texts = corpus(300)
    # A jump far above the baseline latency, even on a loaded 2-core CI machine.
    done = embed([server.url], texts, transport=SlowerAfter(after=40, delay=1.0))
    assert_all_embedded(done, texts)
    stats = done.stats[server.url]
    assert int(stats["window_decreases"]) >= 1 and int(stats["window"]) < 64


def test_wrong_key_stops_at_once_naming_the_variable(tei: Start) -> None:
    server = tei(**TINY, api_key="right-key")
    with pytest.raises(TeiAuthError, match="environment variable TEI_KEY_FOR_TEST") as caught:
        embed([server.url], corpus(50), key="wrong-key", api_key_env="TEI_KEY_FOR_TEST", limits=LIMITS)
    assert caught.value.status_code == 401 and caught.value.server == server.url
    assert "wrong-key" not in str(caught.value) and "right-key" not in str(caught.value)


def test_reranker_stops_at_once_naming_the_model(tei: Start) -> None:
    server = tei(**TINY, model_kind="reranker", model_id="BAAI/bge-reranker-base")
    with pytest.raises(WrongModelKind, match="BAAI/bge-reranker-base, a reranker model") as caught:
        embed([server.url], corpus(50), limits=LIMITS)
    assert "embedding model" in str(caught.value) and caught.value.server == server.url


def test_a_payload_limit_set_too_high_is_learned_from_413(tei: Start) -> None:
    server = tei(max_client_batch_size=32, payload_limit=2_000, record_texts=True)
    texts = [f"text {i} " + "x" * 300 for i in range(40)]
    done = embed([server.url], texts, payload_limit=8_000)  # configured 8 KB, the server takes 2 KB
    assert_all_embedded(done, texts)
    stats = server.stats()
    assert stats["texts"] == Counter(text_digest(t) for t in texts)
    # Each early request too big got 413 and was split; once learned, bodies fit.
    assert 0 < stats["violations"]["payload"] <= 10
    assert done.stats[server.url]["errors"] == {"PayloadTooLarge": stats["violations"]["payload"]}


def test_too_many_inputs_is_split_and_learned(tei: Start) -> None:
    server = tei(max_client_batch_size=4, record_texts=True)
    texts = corpus(40)
    done = embed([server.url], texts, limits=ClientLimits(max_batch_size=16, max_inflight_inputs=16,
                                                         payload_limit=20_000))
    assert_all_embedded(done, texts)
    assert 0 < server.stats()["violations"]["batch_size"] <= 4  # 16 → 8, 8 → 4, 4 (halving is learned)


def test_a_request_the_server_refuses_rejects_each_text_with_the_reason(tei: Start) -> None:
    server = tei(**TINY)
    done = embed([server.url], ["a", "b", "c"], options=EmbedOptions(prompt_name="missing"))
    assert [(f.position, f.reason) for f in done.result.failures] == [(i, "request_refused") for i in range(3)]
    assert all("`default-prompt-name` is set to `missing`" in f.detail for f in done.result.failures)


def test_a_result_is_assembled_from_a_run_of_texts_and_from_positions() -> None:
    run = EmbedResult(np.array([[1, 1], [0, 0]], dtype=np.float32), np.array([True, False]),
                      [Failure(1, FAILURE_TOO_LONG, "too long")], np.array([True, False]))
    alone = EmbedResult(np.array([[3, 3]], dtype=np.float32), np.array([True]), [])
    whole = EmbedResult.assembled(5, 2, [(2, run), (np.array([0]), alone)])
    np.testing.assert_array_equal(whole.vectors, [[3, 3], [0, 0], [1, 1], [0, 0], [0, 0]])
    assert whole.vectors.dtype == np.float32
    assert whole.ok.tolist() == [True, False, True, False, False]  # texts 1 and 4: no part has them
    assert whole.truncated.tolist() == [False, False, True, False, False]
    assert whole.failures == [Failure(3, FAILURE_TOO_LONG, "too long")]  # renumbered to its place in the whole


def test_a_later_part_takes_its_texts_places_failures_included() -> None:
    driver = EmbedResult(np.array([[1, 1], [0, 0], [0, 0]], dtype=np.float32), np.array([True, False, False]),
                         [Failure(1, FAILURE_EMBED, "timed out")])
    rest = EmbedResult(np.array([[2, 2], [0, 0]], dtype=np.float32), np.array([True, False]),
                       [Failure(1, FAILURE_REFUSED, "refused")])
    whole = EmbedResult.assembled(3, 2, [(0, driver), (np.array([1, 2]), rest)])
    np.testing.assert_array_equal(whole.vectors, [[1, 1], [2, 2], [0, 0]])
    assert whole.ok.tolist() == [True, True, False]
    assert whole.failures == [Failure(2, FAILURE_REFUSED, "refused")]


def test_sparse_parts_are_assembled_into_sparse_rows() -> None:
    rows = np.empty(1, dtype=object)
    rows[0] = SparseVector(np.array([3], dtype=np.int32), np.array([0.5], dtype=np.float32))
    whole = EmbedResult.assembled(2, 30522, [(1, EmbedResult(rows, np.array([True]), []))])
    assert whole.vectors.dtype == object
    assert whole.vectors[1] is rows[0]
    assert len(whole.vectors[0].indices) == 0 and not whole.ok[0]
