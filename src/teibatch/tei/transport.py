"""httpx's interface over a faster wire: the client that carries every TEI request, and its aiohttp transport.

The TEI client takes an ``httpx.AsyncClient`` (``tei/client.py``), and that stays its interface.
:func:`open_client` builds it, carried by one of two transports with the same behaviour: for
``http://`` servers with no proxy in the environment, :class:`~teibatch.tei.wire.WireTransport`
(HTTP/1.1 straight over asyncio); for TLS and proxies, :class:`AiohttpTransport` here: one
``aiohttp.ClientSession`` per server, its keep-alive connections pinned to that server. httpx's own
pool (httpcore) looks at every connection it holds on each request (a ``poll`` and a ``getpeername``
each), and anyio registers each read with epoll again: at 32 texts a request, about 38 µs of CPU per
vector under plain httpx, 13 over aiohttp and 8 over the wire transport (``docs/benchmarks.md``).

Every aiohttp error becomes the matching httpx exception here, at this one boundary
(``raise ... from exc``), so that ``TeiClient`` and the code that branches on httpx types
(``bench/measure.py``) see what they saw under httpx (the list in :func:`httpx_error`):

* refused, DNS, TLS (``ClientConnectorError``) → ``ConnectError``;
* ``ConnectionTimeoutError`` → ``ConnectTimeout``; no free connection within the pool timeout →
  ``PoolTimeout``; ``SocketTimeoutError`` (a read) and any other timeout → ``ReadTimeout``;
* ``ServerDisconnectedError``, a body cut short (``ClientPayloadError``), an answer that is not
  HTTP (``ClientResponseError``) → ``RemoteProtocolError``;
* a reset (``ClientOSError``) and anything else aiohttp raises → ``ReadError``.

A connection the server closed while idle (a restarted server) is dropped once the event loop has
seen the close, and the next request opens a new one. httpcore looks at the socket itself before
each request (the ``poll`` that costs it so much); here a request meets a close the loop has not
seen yet only if the loop was blocked while the server closed. Then, as under httpx when the close
comes after its look, the request fails with ``RemoteProtocolError``, ``TeiClient`` reports
``TeiUnavailable`` and the embedder resends the texts; the next request gets a new connection. httpx
has no write timeout here (aiohttp has none): a write that stalls is ended by ``TeiClient``'s
deadline on the whole request, as before.
"""

from __future__ import annotations

import asyncio
import functools
import ssl
import urllib.request
from collections.abc import Iterable
from types import TracebackType
from typing import Any

import aiohttp
import httpx
from yarl import URL

from teibatch.tei.client import tls_settings
from teibatch.tei.wire import WireTransport, take_slot

_HTTP_11 = {"http_version": b"HTTP/1.1"}
_SHORT_WAY = frozenset({"content", "headers", "timeout"})
"""What a request may be given and still take :meth:`TeiHttpClient.request`'s short way."""
_HTTPX_SETS = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
"""Headers aiohttp would add on its own: httpx has set the first three already, and sets no
``Content-Type`` unless the caller does (aiohttp would say ``application/octet-stream``)."""


class AiohttpTransport(httpx.AsyncBaseTransport):
    """An httpx transport over aiohttp: one ``ClientSession`` per server (scheme, host and port).

    ``verify``: the TLS setting, as httpx's (an ``ssl.SSLContext``, ``True`` for the default checks
    or ``False`` for none; see :func:`~teibatch.tei.client.tls_settings`). ``max_connections``:
    connections to each server at most (``None``: no cap; a request past it waits for one up to the
    request's pool timeout).
    ``trust_env``: take proxies from ``HTTP_PROXY``/``HTTPS_PROXY``/``NO_PROXY`` as httpx does.

    Sessions are made on first use, on the event loop of the request; :meth:`aclose` closes them
    all, and a closed transport refuses every request with ``RuntimeError``, as a closed httpx
    client does.
    """

    def __init__(self, *, verify: ssl.SSLContext | bool = False, max_connections: int | None = None,
                 trust_env: bool = False) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be at least 1 or None, not {max_connections}")
        # aiohttp's ``ssl=True`` is its default checks, as httpx's ``verify=True``; ``False`` checks nothing.
        self._ssl: ssl.SSLContext | bool = verify if isinstance(verify, ssl.SSLContext) else bool(verify)
        self._max_connections = max_connections
        self._trust_env = trust_env
        self._sessions: dict[tuple[bytes, bytes, int | None], _Session] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"AiohttpTransport(servers={len(self._sessions)}, closed={self._closed})"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("this transport is closed: open a new client")
        url = request.url
        key = (url.raw_scheme, url.raw_host, url.port)
        session = self._sessions.get(key)
        if session is None:
            session = self._sessions[key] = _Session(self._ssl, self._max_connections, self._trust_env)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        status, headers, content = await session.send(request, body, timeouts)
        return httpx.Response(status, headers=headers, content=content, extensions=_HTTP_11, request=request)

    async def aclose(self) -> None:
        self._closed = True
        sessions, self._sessions = list(self._sessions.values()), {}
        for session in sessions:
            await session.close()

    async def __aenter__(self) -> AiohttpTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None = None, exc_value: BaseException | None = None,
                        traceback: TracebackType | None = None) -> None:
        await self.aclose()


class _Session:
    """One server's aiohttp session and, with a cap, the slots for its connections."""

    def __init__(self, tls: ssl.SSLContext | bool, max_connections: int | None, trust_env: bool) -> None:
        # No cap in the connector: the slots below are the cap, so that waiting for one is told apart
        # (PoolTimeout) from connecting (ConnectTimeout). The response body is read here, whole, and
        # decoded by httpx from the headers as before: aiohttp adds no header of its own and decompresses nothing.
        connector = aiohttp.TCPConnector(limit=0, ssl=tls)
        self.http = aiohttp.ClientSession(connector=connector, auto_decompress=False, trust_env=trust_env,
                                          skip_auto_headers=_HTTPX_SETS,
                                          timeout=aiohttp.ClientTimeout(total=None))
        self.slots = asyncio.Semaphore(max_connections) if max_connections is not None else None

    async def send(self, request: httpx.Request, body: bytes,
                   timeouts: dict[str, float | None]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send ``request`` with ``body``; its status, raw headers and whole body, or an httpx error."""
        if self.slots is None:
            return await self._send(request, body, timeouts)
        await take_slot(self.slots, request, timeouts.get("pool"))
        try:
            return await self._send(request, body, timeouts)
        finally:
            self.slots.release()

    async def _send(self, request: httpx.Request, body: bytes,
                    timeouts: dict[str, float | None]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        encoding = request.headers.encoding  # a property that tries codecs: once, not per header
        headers = [(key.decode(encoding), value.decode(encoding)) for key, value in request.headers.raw]
        try:
            async with self.http.request(request.method, _url(request.url), data=body or None, headers=headers,
                                         timeout=_timeout(timeouts.get("connect"), timeouts.get("read")),
                                         allow_redirects=False) as response:
                content = await response.read()
                return response.status, list(response.raw_headers), content
        except aiohttp.ClientError as exc:
            raise httpx_error(exc, request) from exc
        except (TimeoutError, asyncio.TimeoutError) as exc:  # aiohttp's own are ServerTimeoutError; others: a read's
            raise httpx.ReadTimeout(str(exc) or "timed out", request=request) from exc

    async def close(self) -> None:
        await self.http.close()


def httpx_error(exc: aiohttp.ClientError, request: httpx.Request) -> httpx.TransportError:
    """The httpx exception that stands for ``exc`` (the list in this module's docstring)."""
    message = str(exc) or type(exc).__name__
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        return httpx.ConnectTimeout(message, request=request)
    if isinstance(exc, aiohttp.ServerTimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if isinstance(exc, aiohttp.ClientConnectorError):
        return httpx.ConnectError(message, request=request)
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientPayloadError | aiohttp.ClientResponseError):
        return httpx.RemoteProtocolError(message, request=request)
    return httpx.ReadError(message, request=request)


@functools.lru_cache(maxsize=256)
def _timeout(connect: float | None, read: float | None) -> aiohttp.ClientTimeout:
    """aiohttp's timeouts for httpx's connect and read ones (a few distinct values a run: cached)."""
    return aiohttp.ClientTimeout(total=None, sock_connect=connect, sock_read=read)


@functools.lru_cache(maxsize=1024)
def _url(url: httpx.URL) -> URL:
    """``url`` as yarl's, already encoded by httpx (a client sends to a few URLs: cached)."""
    return URL(str(url), encoded=True)


def _proxies_in_env() -> bool:
    return bool(urllib.request.getproxies())


class _AnswerCookies(httpx.Cookies):
    """httpx's cookies, read from an answer only when it sets one.

    httpx reads every answer for cookies through urllib's view of it (an ``email.message`` of its
    headers, about 15% of the client's CPU per request); an answer with no ``Set-Cookie`` header
    adds none, so looking for that header first changes nothing but the cost.
    """

    def extract_cookies(self, response: httpx.Response) -> None:
        headers = response.headers
        if "set-cookie" in headers or "set-cookie2" in headers:
            super().extract_cookies(response)


class TeiHttpClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` whose cookies are :class:`_AnswerCookies`, with a short way for the
    requests TEI gets; everything else is httpx's."""

    def __init__(self, *, transport: httpx.AsyncBaseTransport) -> None:
        super().__init__(transport=transport)
        self.cookies = httpx.Cookies()
        self._carrier = transport

    async def request(self, method: str, url: httpx.URL | str, **options: Any) -> httpx.Response:
        """httpx's ``request``; one given only a body, headers and a timeout, while the client holds no
        cookie, auth or hook, goes straight to the transport.

        What httpx's longer way adds does nothing to such a request here: this client has no base URL,
        mounts or proxies (its one transport was given), follows no redirect by default, and its
        transport reads the whole answer. What that way builds per request (the auth flow, the
        redirect loop, the stream wrapper, the log line) is about a tenth of a sender's CPU at TEI's
        32 texts a request (``docs/benchmarks.md``).
        """
        if options.keys() - _SHORT_WAY or self.cookies or self.auth is not None or any(self.event_hooks.values()):
            return await super().request(method, url, **options)
        timeout = options.get("timeout", httpx.USE_CLIENT_DEFAULT)
        settings = self.timeout if isinstance(timeout, httpx._client.UseClientDefault) else httpx.Timeout(timeout)
        request = httpx.Request(method, url, content=options.get("content"),
                                headers=self._merge_headers(options.get("headers")),
                                extensions={"timeout": settings.as_dict()})
        response = await self._carrier.handle_async_request(request)
        self.cookies.extract_cookies(response)
        return response

    @property
    def cookies(self) -> httpx.Cookies:
        return self._answer_cookies

    @cookies.setter
    def cookies(self, cookies: httpx._types.CookieTypes) -> None:
        self._answer_cookies = _AnswerCookies(cookies)


def open_client(urls: Iterable[str], max_connections: int | None = None) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for TEI requests to ``urls``: carried by :class:`~teibatch.tei.wire.WireTransport`
    when every URL is ``http://`` and the environment names no proxy, else by :class:`AiohttpTransport`.

    The one way teibatch builds a client for TEI: TLS from :func:`~teibatch.tei.client.tls_settings`
    (a context only when a URL is HTTPS), ``max_connections`` per server (``None``: no cap), and
    proxies from the environment only when one is set there (looking them up costs each request).
    Use it as ``async with`` or close it with ``aclose``; closing it closes every connection.
    """
    urls = list(urls)
    proxies = _proxies_in_env()
    transport: httpx.AsyncBaseTransport
    if all(url.startswith("http://") for url in urls) and not proxies:
        transport = WireTransport(max_connections=max_connections)
    else:
        transport = AiohttpTransport(verify=tls_settings(*urls), max_connections=max_connections, trust_env=proxies)
    return TeiHttpClient(transport=transport)
