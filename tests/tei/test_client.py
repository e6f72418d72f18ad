"""``TeiClient`` against a built-in server: both routes, the key, timeouts, dead servers, messages."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import httpx
import numpy as np
import orjson
import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import ServerFault, TeiAuthError, TeiUnavailable, WrongModelKind
from teibatch.server import HashingEmbedder
from teibatch.sparse import SparseVector
from teibatch.tei import ROUTE_EMBED, ROUTE_EMBED_SPARSE, ROUTE_OPENAI_BASE64, EmbedOptions, RequestPacker, TeiClient
from teibatch.tei.client import DEFAULT_TIMEOUT_S, MIN_TOKENS_PER_S
from tests.tei.conftest import ServerHandle, free_port

Start = Callable[..., ServerHandle]
TEXTS = ["first text", "second, with é and \"quotes\"", "third\nline"]


def call(url: str, route: str = ROUTE_EMBED, *, key: str | None = None, timeout: float = 10.0,
         api_key_env: str | None = None, texts: list[str] = TEXTS) -> np.ndarray:
    async def main() -> np.ndarray:
        async with httpx.AsyncClient() as http:
            client = TeiClient(Endpoint(url, key), http, timeout=timeout, api_key_env=api_key_env)
            options = EmbedOptions(normalize=route != ROUTE_EMBED_SPARSE)
            packer = RequestPacker(route, options, max_batch_size=32, payload_limit=2_000_000)
            (batch,) = packer.pack(enumerate(texts))
            return await asyncio.wait_for(client.embed(batch.request), 30)

    return asyncio.run(main())


@pytest.mark.parametrize("route", [ROUTE_EMBED, ROUTE_OPENAI_BASE64])
def test_both_routes_give_the_servers_vectors_in_order(tei: Start, route: str) -> None:
    server = tei(api_key="secret")
    vectors = call(server.url, route, key="secret")
    assert vectors.dtype == np.float32
    np.testing.assert_array_equal(vectors, HashingEmbedder(384).embed(TEXTS))


def test_info_reads_limits_and_remembers_the_model(tei: Start) -> None:
    server = tei(max_client_batch_size=4, max_concurrent_requests=8, model_id="org/model")

    async def main() -> tuple[object, str | None]:
        async with httpx.AsyncClient() as http:
            client = TeiClient(Endpoint(server.url), http)
            return await client.info(), client.model

    info, model = asyncio.run(main())
    assert (info.max_client_batch_size, info.max_concurrent_requests, info.version) == (4, 8, "1.9.3")  # type: ignore[attr-defined]
    assert model == "org/model"


def test_missing_key_says_where_to_put_it(tei: Start) -> None:
    server = tei(api_key="secret")
    with pytest.raises(TeiAuthError, match=r"none was sent.*servers\.api_key_env") as caught:
        call(server.url)
    assert caught.value.status_code == 401


def test_wrong_key_names_the_variable_and_never_the_key(tei: Start) -> None:
    server = tei(api_key="secret")
    with pytest.raises(TeiAuthError, match="environment variable MY_TEI_KEY") as caught:
        call(server.url, key="guess", api_key_env="MY_TEI_KEY")
    assert "guess" not in str(caught.value) and "secret" not in str(caught.value)
    assert "guess" not in repr(TeiClient(Endpoint(server.url, "guess"), httpx.AsyncClient()))


def test_reranker_names_the_model_and_the_fix(tei: Start) -> None:
    server = tei(model_kind="reranker", model_id="BAAI/bge-reranker-base")
    with pytest.raises(WrongModelKind, match="serves BAAI/bge-reranker-base, a reranker model") as caught:
        call(server.url)
    assert "launched with an embedding model" in str(caught.value)
    assert caught.value.server == server.url and caught.value.status_code == 424


def test_a_hung_request_times_out(tei: Start) -> None:
    server = tei(fault_hang_after=1)
    with pytest.raises(TeiUnavailable, match="no complete answer within") as caught:
        call(server.url, timeout=0.3)
    assert caught.value.status_code is None and caught.value.retryable


def test_a_refused_connection_is_unavailable() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(TeiUnavailable, match="connection failed") as caught:
        call(url)
    assert caught.value.server == url and caught.value.status_code is None

    async def health() -> bool:
        async with httpx.AsyncClient() as http:
            return await TeiClient(Endpoint(url), http).healthy(timeout=1)

    assert asyncio.run(health()) is False


def test_timeout_grows_with_the_tokens_of_the_request() -> None:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=32, payload_limit=10**7)
    client = TeiClient(Endpoint("http://127.0.0.1:1"), httpx.AsyncClient())
    (small,) = packer.pack([(0, "hi")])
    (large,) = packer.pack(enumerate(["word " * 2000] * 32))
    assert client.timeout_for(small.request) == pytest.approx(DEFAULT_TIMEOUT_S, abs=0.01)
    extra = large.request.tokens / MIN_TOKENS_PER_S
    assert client.timeout_for(large.request) == pytest.approx(DEFAULT_TIMEOUT_S + extra)
    assert large.request.tokens >= 32 * 2000


@pytest.mark.parametrize("body", [pytest.param(b"<html><body>Bad Gateway</body></html>", id="html"),
                                  pytest.param(b"", id="empty"),
                                  pytest.param(b"[1, 2]", id="json-list")])
def test_info_that_is_not_teis_json_is_a_bad_body_fault(body: bytes) -> None:
    url = "http://127.0.0.1:9"

    async def main() -> None:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        async with httpx.AsyncClient(transport=transport) as http:
            await TeiClient(Endpoint(url), http).info()

    with pytest.raises(ServerFault, match="not TEI's /info JSON") as caught:
        asyncio.run(main())
    assert (caught.value.kind, caught.value.server, caught.value.status_code) == ("bad body", url, 200)


def test_embed_returns_only_checked_vectors() -> None:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=32, payload_limit=2_000_000)
    (batch,) = packer.pack(enumerate(TEXTS))
    answer = HashingEmbedder(384).embed(TEXTS)

    async def main(expected_dimension: int, normalized: bool = False) -> np.ndarray:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=orjson.dumps(answer.tolist())))
        async with httpx.AsyncClient(transport=transport) as http:
            client = TeiClient(Endpoint("http://127.0.0.1:9"), http, expected_dimension=expected_dimension,
                               normalized=normalized)
            return await client.embed(batch.request)

    np.testing.assert_array_equal(asyncio.run(main(expected_dimension=384, normalized=True)), answer)
    with pytest.raises(ServerFault, match="answered 384-dimension vectors, expected 1024") as caught:
        asyncio.run(main(expected_dimension=1024))
    assert caught.value.kind == "wrong dimension"


def test_embed_sparse_gives_the_servers_entries_per_text(tei: Start) -> None:
    server = tei(pooling="splade")
    rows = call(server.url, ROUTE_EMBED_SPARSE)
    want = HashingEmbedder(384).embed_sparse(TEXTS)
    assert rows.shape == (len(TEXTS),)
    for row, (indices, values) in zip(rows, want, strict=True):
        assert row == SparseVector(indices.astype(np.int32), values)
        assert (row.indices.dtype, row.values.dtype) == (np.int32, np.float32)


@pytest.mark.parametrize(("answer", "kind", "says"), [
    pytest.param([[{"index": 5, "value": 1.0}]] * 2, "wrong count", "2 sparse vectors for 3 inputs", id="count"),
    pytest.param([[{"index": 30522, "value": 1.0}], [], []], "wrong dimension", "index 30522, outside the "
                 "vocabulary of 30522", id="index-beyond-the-vocabulary"),
    pytest.param([[], [{"index": 1, "value": 1e39}], []], "non-finite", "the first for input 1",
                 id="beyond-float32"),
])
def test_embed_sparse_returns_only_checked_vectors(answer: list[list[dict[str, float]]], kind: str,
                                                   says: str) -> None:
    packer = RequestPacker(ROUTE_EMBED_SPARSE, EmbedOptions(), max_batch_size=32, payload_limit=2_000_000)
    (batch,) = packer.pack(enumerate(TEXTS))
    body = orjson.dumps(answer)

    async def main() -> np.ndarray:
        transport = httpx.MockTransport(lambda request: httpx.Response(200, content=body))
        async with httpx.AsyncClient(transport=transport) as http:
            return await TeiClient(Endpoint("http://127.0.0.1:9"), http, expected_dimension=30522).embed(batch.request)

    with pytest.raises(ServerFault, match=says) as caught:
        asyncio.run(main())
    assert caught.value.kind == kind


def test_dense_vectors_asked_of_a_splade_model_name_model_kind(tei: Start) -> None:
    server = tei(pooling="splade", model_id="naver/splade-v3")
    with pytest.raises(WrongModelKind, match=r"naver/splade-v3, an embedding model with splade pooling.*"
                                             r"set model\.kind: sparse"):
        call(server.url)


def test_sparse_vectors_asked_of_a_dense_model_name_the_fix(tei: Start) -> None:
    server = tei(model_id="org/dense")
    with pytest.raises(WrongModelKind, match=r"cannot give sparse vectors.*SPLADE model, or set model\.kind: dense"):
        call(server.url, ROUTE_EMBED_SPARSE)
