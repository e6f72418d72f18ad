"""``WireTransport``: HTTP/1.1 answers as servers and proxies really frame them, from scripted servers on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field

import httpx
import pytest

from teibatch.tei.transport import AiohttpTransport, open_client
from teibatch.tei.wire import MAX_HEAD_BYTES, WireTransport
from tests.tei.test_transport import run


@dataclass
class Scripted:
    url: str
    connections: int = 0
    requests: list[bytes] = field(default_factory=list)


@contextlib.asynccontextmanager
async def scripted(replies: Sequence[bytes], *, close_after: bool = False,
                   trickle_s: float = 0.0, reset: bool = False) -> AsyncIterator[Scripted]:
    """A server that reads each request (head and Content-Length body) and writes the next of ``replies``
    as raw bytes: ``close_after`` closes the connection after each reply; ``trickle_s`` writes a reply a
    byte at a time, that long apart; ``reset`` answers the first request with a TCP reset instead."""
    state = Scripted("")
    queue = list(replies)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        state.connections += 1
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                state.requests.append(head + await reader.readexactly(length))
                if reset:
                    sock = writer.get_extra_info("socket")
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                    writer.transport.abort()
                    return
                reply = queue.pop(0)
                if trickle_s:
                    for i in range(len(reply)):
                        writer.write(reply[i:i + 1])
                        await writer.drain()
                        await asyncio.sleep(trickle_s)
                else:
                    writer.write(reply)
                    await writer.drain()
                if close_after:
                    writer.close()
                    return
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    state.url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    try:
        yield state
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 5)


def exchange(replies: Sequence[bytes], requests: int = 1, **options: object) -> tuple[list[httpx.Response], Scripted]:
    """``requests`` POSTs through a ``WireTransport`` client to a scripted server answering ``replies``."""

    async def main() -> tuple[list[httpx.Response], Scripted]:
        async with scripted(replies, **options) as server, \
                httpx.AsyncClient(transport=WireTransport()) as http:  # type: ignore[arg-type]
            answers = [await http.post(server.url + "/embed", content=b'{"inputs":["a"]}',
                                       timeout=httpx.Timeout(5.0, read=1.0)) for _ in range(requests)]
            return answers, server

    return run(main)


OK_JSON = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 9\r\n\r\n[1, 2, 3]"


def test_answers_on_one_kept_alive_connection() -> None:
    answers, server = exchange([OK_JSON, OK_JSON, OK_JSON], requests=3)
    assert [a.json() for a in answers] == [[1, 2, 3]] * 3 and server.connections == 1
    head = server.requests[0].split(b"\r\n\r\n")[0].split(b"\r\n")
    assert head[0] == b"POST /embed HTTP/1.1" and b"Host: 127.0.0.1:" + server.url.rsplit(":")[-1].encode() in head
    assert server.requests[0].endswith(b'\r\n\r\n{"inputs":["a"]}') and b"Content-Length: 16" in head


def test_a_chunked_answer_with_extensions_and_trailers() -> None:
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"4;ext=1\r\n[1, \r\n5\r\n2, 3]\r\n0\r\nX-Trailer: t\r\n\r\n")
    answers, server = exchange([chunked, chunked], requests=2)
    assert [a.json() for a in answers] == [[1, 2, 3]] * 2 and server.connections == 1


def test_a_chunked_answer_a_byte_at_a_time_within_the_read_timeout() -> None:
    """The read timeout (1 s) is between bytes, not for the whole answer (about 2 s here)."""
    chunked = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n9\r\n[1, 2, 3]\r\n0\r\n\r\n"
    answers, _ = exchange([chunked], trickle_s=0.03)
    assert answers[0].json() == [1, 2, 3]


def test_an_answer_that_ends_with_the_connection() -> None:
    answers, server = exchange([b"HTTP/1.1 200 OK\r\n\r\n[1, 2, 3]"] * 2, requests=2, close_after=True)
    assert [a.json() for a in answers] == [[1, 2, 3]] * 2 and server.connections == 2


@pytest.mark.parametrize("reply", [
    pytest.param(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 9\r\n\r\n[1, 2, 3]", id="connection-close"),
    pytest.param(b"HTTP/1.0 200 OK\r\nContent-Length: 9\r\n\r\n[1, 2, 3]", id="http-1.0"),
])
def test_an_answer_that_ends_its_connection_is_not_reused(reply: bytes) -> None:
    answers, server = exchange([reply, reply], requests=2, close_after=True)
    assert [a.json() for a in answers] == [[1, 2, 3]] * 2 and server.connections == 2


def test_an_interim_answer_is_passed_over_and_an_empty_one_is_empty() -> None:
    answers, server = exchange([b"HTTP/1.1 100 Continue\r\n\r\n" + OK_JSON,
                                b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
                                b"HTTP/1.1 204 No Content\r\n\r\n"], requests=3)
    assert [(a.status_code, a.content) for a in answers] == [(200, b"[1, 2, 3]"), (204, b""), (204, b"")]
    assert server.connections == 1


@pytest.mark.parametrize(("reply", "problem"), [
    pytest.param(b"SSH-2.0-OpenSSH\r\n\r\n", "not an HTTP/1.x answer", id="not-http"),
    pytest.param(b"HTTP/1.1 200 OK\r\nno colon here\r\n\r\n", "without a colon", id="bad-header"),
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n", "Content-Length", id="bad-length"),
    pytest.param(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n", "not hex", id="bad-chunk"),
    pytest.param(b"HTTP/1.1 200 OK\r\nX: " + b"y" * MAX_HEAD_BYTES, "too long", id="head-too-long"),
])
def test_what_is_not_http_is_a_remote_protocol_error(reply: bytes, problem: str) -> None:
    with pytest.raises(httpx.RemoteProtocolError, match=problem):
        exchange([reply])


def test_an_answer_cut_short_is_a_remote_protocol_error() -> None:
    with pytest.raises(httpx.RemoteProtocolError, match="before its answer was whole"):
        exchange([b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n[1, 2"], close_after=True)


def test_a_reset_is_a_read_error() -> None:
    with pytest.raises(httpx.ReadError):
        exchange([], reset=True)


def test_a_server_that_falls_silent_mid_answer_is_a_read_timeout() -> None:
    with pytest.raises(httpx.ReadTimeout):
        exchange([OK_JSON[:40]])  # the rest never comes; the read timeout is 1 s


def test_https_is_not_carried_and_open_client_picks_the_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    async def main() -> None:
        async with httpx.AsyncClient(transport=WireTransport()) as http:  # type: ignore[arg-type]
            await http.get("https://127.0.0.1:9/health")

    with pytest.raises(httpx.UnsupportedProtocol):
        run(main)
    transport = lambda urls: open_client(urls)._carrier  # type: ignore[attr-defined]  # noqa: E731
    assert isinstance(transport(["http://127.0.0.1:9"]), WireTransport)
    assert isinstance(transport(["http://127.0.0.1:9", "https://127.0.0.1:10"]), AiohttpTransport)
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:3128")
    assert isinstance(transport(["http://127.0.0.1:9"]), AiohttpTransport)


def test_a_cap_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="max_connections"):
        WireTransport(max_connections=0)
