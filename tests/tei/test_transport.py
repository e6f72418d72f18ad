"""The transports under ``open_client`` (``WireTransport``, and ``AiohttpTransport`` for TLS and proxies),
each under an httpx client, against real servers on 127.0.0.1: what httpx callers see."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

import aiohttp
import httpx
import numpy as np
import pytest
from aiohttp import web

from teibatch.endpoint import Endpoint
from teibatch.errors import PayloadTooLarge, TeiOverloaded, TeiUnavailable
from teibatch.server import HashingEmbedder
from teibatch.tei import ROUTE_EMBED, EmbedOptions, EmbedRequest, RequestPacker, TeiClient
from teibatch.tei import transport as transport_module
from teibatch.tei.transport import AiohttpTransport, httpx_error, open_client
from tests.tei.conftest import ServerHandle, free_port

Start = Callable[..., ServerHandle]
T = TypeVar("T")
TEXTS = ["first text", "second, with é and \"quotes\"", "third\nline"]
DEADLINE_S = 30.0
"""No test here may wait longer than this for one call (a hang is a failure, not a stuck suite)."""


@pytest.fixture(autouse=True, params=["wire", "aiohttp"])
def carrier(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test here once per transport ``open_client`` may choose (aiohttp: for TLS and proxies)."""
    if request.param == "aiohttp":
        monkeypatch.setattr(transport_module, "WireTransport",
                            lambda max_connections=None: AiohttpTransport(max_connections=max_connections))
    return str(request.param)


def run(main: Callable[[], Awaitable[T]]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(main(), DEADLINE_S)

    return asyncio.run(bounded())


def embed_request(texts: list[str] = TEXTS) -> EmbedRequest:
    packer = RequestPacker(ROUTE_EMBED, EmbedOptions(), max_batch_size=32, payload_limit=2_000_000)
    (batch,) = packer.pack(enumerate(texts))
    return batch.request


@contextlib.asynccontextmanager
async def answering(status: int, body: bytes, headers: dict[str, str]) -> AsyncIterator[str]:
    """A server on this loop that answers every request with ``status``, ``body`` and ``headers``."""

    async def handler(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(status=status, body=body, headers=headers)

    async with serving(handler) as url:
        yield url


@contextlib.asynccontextmanager
async def serving(handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> AsyncIterator[str]:
    """An aiohttp server on this loop that gives every request, on any route, to ``handler``; its URL."""
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def silent(*, hang_up: bool = False) -> AsyncIterator[str]:
    """A server on this loop that reads each request and never answers (``hang_up``: closes instead)."""
    held: list[asyncio.StreamWriter] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readuntil(b"\r\n\r\n")
        if hang_up:
            writer.close()
        else:
            held.append(writer)

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        for writer in held:
            writer.close()
        server.close()
        await server.wait_closed()


def test_an_embed_through_the_transport_gives_the_servers_vectors(tei: Start) -> None:
    server = tei(api_key="secret")

    async def main() -> np.ndarray:
        async with open_client([server.url]) as http:
            client = TeiClient(Endpoint(server.url, "secret"), http)
            return await client.embed(embed_request())

    np.testing.assert_array_equal(run(main), HashingEmbedder(384).embed(TEXTS))


@pytest.mark.parametrize(("status", "headers"), [
    pytest.param(413, {}, id="413"),
    pytest.param(429, {"Retry-After": "7"}, id="429-retry-after"),
    pytest.param(422, {"X-Tei-Note": "kept"}, id="422"),
])
def test_an_error_answer_comes_through_with_its_status_headers_and_body(status: int, headers: dict[str, str]) -> None:
    body = b'{"error":"no","error_type":"Validation"}'

    async def main() -> httpx.Response:
        async with answering(status, body, headers) as url, open_client([url]) as http:
            return await http.post(url + "/embed", content=b'{"inputs":["a"]}')

    response = run(main)
    assert (response.status_code, response.content) == (status, body)
    for name, value in headers.items():
        assert response.headers[name] == value


def test_teis_refusals_become_the_same_typed_errors(tei: Start) -> None:
    small, busy = tei(payload_limit=64), tei(fault_rate_429=1.0)
    request = embed_request(["word " * 40])

    async def main(url: str) -> None:
        async with open_client([url]) as http:
            await TeiClient(Endpoint(url), http).embed(request)

    with pytest.raises(PayloadTooLarge) as too_large:
        run(lambda: main(small.url))
    with pytest.raises(TeiOverloaded) as overloaded:
        run(lambda: main(busy.url))
    assert (too_large.value.status_code, overloaded.value.status_code) == (413, 429)


def test_a_refused_connection_is_httpx_connect_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"

    async def raw() -> None:
        async with open_client([url]) as http:
            await http.get(url + "/health")

    async def through_client() -> None:
        async with open_client([url]) as http:
            await TeiClient(Endpoint(url), http).info()

    with pytest.raises(httpx.ConnectError):
        run(raw)
    with pytest.raises(TeiUnavailable, match="connection failed") as caught:
        run(through_client)
    assert isinstance(caught.value.__cause__, httpx.ConnectError)  # what bench/measure.py reads


def test_a_server_that_never_answers_is_a_read_timeout() -> None:
    async def main() -> None:
        async with silent() as url, open_client([url]) as http:
            await http.get(url + "/health", timeout=httpx.Timeout(5.0, read=0.2))

    with pytest.raises(httpx.ReadTimeout):
        run(main)


def test_no_free_connection_within_the_pool_timeout_is_a_pool_timeout() -> None:
    async def main() -> None:
        async with silent() as url, open_client([url], max_connections=1) as http:
            stuck = asyncio.create_task(http.get(url + "/health", timeout=5.0))
            await asyncio.sleep(0.1)
            try:
                await http.get(url + "/health", timeout=httpx.Timeout(5.0, pool=0.2))
            finally:
                stuck.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await stuck

    with pytest.raises(httpx.PoolTimeout):
        run(main)


def test_a_server_that_hangs_up_without_answering_is_a_remote_protocol_error() -> None:
    async def main() -> None:
        async with silent(hang_up=True) as url, open_client([url]) as http:
            await http.post(url + "/embed", content=b'{"inputs":["a"]}')

    with pytest.raises(httpx.RemoteProtocolError):
        run(main)


@pytest.mark.parametrize("loop_sees_the_close", [pytest.param(True, id="close-seen"),
                                                 pytest.param(False, id="close-unseen")])
def test_a_server_restarted_between_requests_is_met_on_a_new_connection(tei: Start, loop_sees_the_close: bool) -> None:
    """As in a run, where the loop never stops for long, the close is seen and the next request gets a new
    connection. A request that meets a close not seen yet (the loop was blocked while the server restarted)
    fails as httpx fails when the close comes after its check: ``RemoteProtocolError``, which ``TeiClient``
    reports as :class:`TeiUnavailable` for the embedder to resend; the request after it gets a new connection."""
    server = tei()
    body = embed_request().body
    json = {"content-type": "application/json"}

    async def post(http: httpx.AsyncClient) -> int | str:
        try:
            return (await http.post(server.url + "/embed", content=body, headers=json)).status_code
        except httpx.RemoteProtocolError:
            return "RemoteProtocolError"

    async def main() -> list[int | str]:
        async with open_client([server.url]) as http:
            statuses = [await post(http)]
            server.stop()
            server.start()  # same port; the old keep-alive connection is closed
            if loop_sees_the_close:
                await asyncio.sleep(0.1)
            statuses += [await post(http), await post(http)]
            return statuses

    expected: list[int | str] = [200, 200, 200] if loop_sees_the_close else [200, "RemoteProtocolError", 200]
    assert run(main) == expected


def test_a_cancelled_request_leaves_the_client_usable(tei: Start) -> None:
    server = tei(fault_hang_after=1)  # the first embedding never gets an answer
    body = embed_request().body
    json = {"content-type": "application/json"}

    async def main() -> int:
        async with open_client([server.url]) as http:
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(http.post(server.url + "/embed", content=body, headers=json), 0.3)
            return (await http.post(server.url + "/embed", content=body, headers=json)).status_code

    assert run(main) == 200


def test_a_closed_client_refuses_and_so_does_its_transport(tei: Start) -> None:
    server = tei()

    async def main() -> None:
        transport = AiohttpTransport()
        http = httpx.AsyncClient(transport=transport)
        assert (await http.get(server.url + "/health")).status_code == 200
        await http.aclose()
        with pytest.raises(RuntimeError, match="closed"):
            await http.get(server.url + "/health")
        with pytest.raises(RuntimeError, match="closed"):
            await transport.handle_async_request(httpx.Request("GET", server.url + "/health"))

    run(main)


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        AiohttpTransport(max_connections=0)


@pytest.mark.parametrize("make", [pytest.param(lambda url: httpx.AsyncClient(), id="httpx"),
                                  pytest.param(lambda url: open_client([url]), id="open_client")])
def test_a_cookie_an_answer_sets_is_kept_as_httpx_keeps_it(make: Callable[[str], httpx.AsyncClient]) -> None:
    """A proxy's sticky-session cookie, say: answers are read for cookies only when they set one."""

    async def main() -> dict[str, str]:
        async with answering(200, b"{}", {"Set-Cookie": "sticky=abc; Path=/"}) as url, make(url) as http:
            await http.get(url + "/health")
            return dict(http.cookies)

    assert run(main) == {"sticky": "abc"}


@contextlib.asynccontextmanager
async def echoing() -> AsyncIterator[str]:
    """A server on this loop that answers each request with its method, path, headers and body as JSON."""

    async def handler(request: web.Request) -> web.Response:
        body = await request.read()
        return web.json_response({"method": request.method, "path": request.path_qs, "body": body.decode(),
                                  "headers": sorted([k.lower(), v] for k, v in request.headers.items())})

    async with serving(handler) as url:
        yield url


def test_the_clients_short_way_sends_what_httpx_sends() -> None:
    """open_client's request with a body, headers and a timeout skips httpx's auth, redirect and hook
    steps: the server sees the same request, and the answer is the same, as through httpx's own way."""

    async def main() -> tuple[dict[str, object], dict[str, object]]:
        async with echoing() as url, open_client([url]) as ours, \
                httpx.AsyncClient(transport=AiohttpTransport()) as plain:
            seen = []
            for http in (ours, plain):
                response = await http.request("POST", url + "/embed?x=1", content=b'{"inputs": "a"}',
                                              headers={"Authorization": "Bearer k", "Content-Type": "application/json"},
                                              timeout=httpx.Timeout(5.0))
                assert response.status_code == 200
                assert response.request.extensions["timeout"] == httpx.Timeout(5.0).as_dict()
                seen.append(response.json())
            return seen[0], seen[1]

    short, long = run(main)
    assert short == long
    assert ["authorization", "Bearer k"] in short["headers"]  # type: ignore[operator]
    assert short["body"] == '{"inputs": "a"}'


def test_a_client_holding_a_cookie_sends_it_on_every_request() -> None:
    """The short way is only for a client with nothing to add: one holding a cookie goes httpx's way."""

    async def main() -> dict[str, object]:
        async with echoing() as url, open_client([url]) as http:
            http.cookies.set("sticky", "abc")
            response = await http.request("POST", url + "/embed", content=b"{}", headers={"Authorization": "Bearer k"})
            return response.json()

    assert ["cookie", "sticky=abc"] in run(main)["headers"]  # type: ignore[operator]


@pytest.mark.parametrize(("error", "expected"), [
    pytest.param(aiohttp.ConnectionTimeoutError("connect"), httpx.ConnectTimeout, id="connect-timeout"),
    pytest.param(aiohttp.SocketTimeoutError("read"), httpx.ReadTimeout, id="read-timeout"),
    pytest.param(aiohttp.ServerDisconnectedError(), httpx.RemoteProtocolError, id="disconnected"),
    pytest.param(aiohttp.ClientPayloadError("cut short"), httpx.RemoteProtocolError, id="payload"),
    pytest.param(aiohttp.ClientOSError(104, "reset"), httpx.ReadError, id="reset"),
])
def test_each_aiohttp_error_has_its_httpx_type(error: aiohttp.ClientError, expected: type[httpx.HTTPError]) -> None:
    """The cases a loopback server cannot make at will (a connect that times out), and the rest."""
    request = httpx.Request("POST", "http://127.0.0.1:9/embed")
    mapped = httpx_error(error, request)
    assert type(mapped) is expected and mapped.request is request
