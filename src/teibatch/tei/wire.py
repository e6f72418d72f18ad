"""httpx's interface, HTTP/1.1 straight over asyncio: the transport of plain-HTTP TEI requests.

A TEI request is a small POST on a keep-alive connection and its answer one JSON body, thousands of
times a second with fast GPUs. :class:`WireTransport` does only that, as an asyncio ``Protocol``
per connection: the request's head and body in one write, the answer parsed in place as its bytes
arrive (a ``Content-Length`` body, a chunked one, or one that ends with the connection), connections
pinned per server and reused while both sides keep them open. That is about a third of the CPU of
the same request through aiohttp (``docs/benchmarks.md``). ``open_client`` (``tei/transport.py``)
uses it for ``http://`` servers with no proxy in the environment; TLS and proxies go through aiohttp.

Failures are httpx's exceptions, as under :class:`~teibatch.tei.transport.AiohttpTransport`:

* refused or unreachable (``OSError`` while connecting) → ``ConnectError``; no connection within
  the connect timeout → ``ConnectTimeout``; no free connection within the pool timeout → ``PoolTimeout``;
* no byte of the answer for the read timeout → ``ReadTimeout``;
* the server closes before the answer is whole, or answers with what is not HTTP/1.x →
  ``RemoteProtocolError``; a reset → ``ReadError``.

A connection the server closed while idle is dropped once the event loop has seen the close; a
request that meets a close the loop has not seen yet fails with ``RemoteProtocolError`` (``TeiClient``
reports ``TeiUnavailable``, the embedder resends), as under aiohttp. There is no write timeout: a write
that stalls is ended by ``TeiClient``'s deadline on the whole request. A cancelled request closes its
connection (half a conversation is never reused).
"""

from __future__ import annotations

import asyncio
from types import TracebackType

import httpx

_HTTP_11 = {"http_version": b"HTTP/1.1"}
MAX_HEAD_BYTES = 65_536
"""The most an answer's status line and headers may take (TEI's are a few hundred bytes)."""

_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)


class WireTransport(httpx.AsyncBaseTransport):
    """An httpx transport for ``http://`` URLs: HTTP/1.1 keep-alive connections over asyncio, one pool
    per server (host and port).

    ``max_connections``: connections to each server at most (``None``: no cap; a request past it
    waits for one up to the request's pool timeout). :meth:`aclose` closes every connection, and a
    closed transport refuses every request with ``RuntimeError``, as a closed httpx client does.
    """

    def __init__(self, *, max_connections: int | None = None) -> None:
        if max_connections is not None and max_connections < 1:
            raise ValueError(f"max_connections must be at least 1 or None, not {max_connections}")
        self._max_connections = max_connections
        self._pools: dict[tuple[bytes, int | None], _Pool] = {}
        self._closed = False

    def __repr__(self) -> str:
        return f"WireTransport(servers={len(self._pools)}, closed={self._closed})"

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if self._closed:
            raise RuntimeError("this transport is closed: open a new client")
        url = request.url
        if url.scheme != "http":
            raise httpx.UnsupportedProtocol(f"WireTransport carries http:// only, not {url.scheme}://",
                                            request=request)
        key = (url.raw_host, url.port)
        pool = self._pools.get(key)
        if pool is None or pool.loop is not asyncio.get_running_loop():
            pool = self._pools[key] = _Pool(url.host, url.port or 80, self._max_connections)
        timeouts = request.extensions.get("timeout", {})
        body = await request.aread()
        head = b"%s %s HTTP/1.1\r\n%s\r\n" % (request.method.encode(), url.raw_path,
                                               b"".join(b"%s: %s\r\n" % pair for pair in request.headers.raw))
        status, headers, content = await pool.exchange(request, head + body, timeouts)
        return httpx.Response(status, headers=headers, content=content, extensions=_HTTP_11, request=request)

    async def aclose(self) -> None:
        self._closed = True
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            pool.close()

    async def __aenter__(self) -> WireTransport:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None = None, exc_value: BaseException | None = None,
                        traceback: TracebackType | None = None) -> None:
        await self.aclose()


async def take_slot(slots: asyncio.Semaphore, request: httpx.Request, timeout: float | None) -> None:
    """One of a server's connection ``slots`` for ``request`` (the caller releases it), waiting at most
    ``timeout``; else ``httpx.PoolTimeout``. Both transports cap connections this way."""
    try:
        await asyncio.wait_for(slots.acquire(), timeout)
    except (TimeoutError, asyncio.TimeoutError) as exc:
        raise httpx.PoolTimeout("no free connection within the pool timeout", request=request) from exc


class _Pool:
    """One server's connections: idle ones to reuse, and with a cap, the slots for them all."""

    def __init__(self, host: str, port: int, max_connections: int | None) -> None:
        self.loop = asyncio.get_running_loop()
        self.host, self.port = host, port
        self.idle: list[_Connection] = []
        self.every: set[_Connection] = set()
        self.slots = asyncio.Semaphore(max_connections) if max_connections is not None else None

    async def exchange(self, request: httpx.Request, data: bytes,
                       timeouts: dict[str, float | None]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Send ``data`` (the whole request) on a free connection; the answer's status, headers and body."""
        if self.slots is None:
            return await self._exchange(request, data, timeouts)
        await take_slot(self.slots, request, timeouts.get("pool"))
        try:
            return await self._exchange(request, data, timeouts)
        finally:
            self.slots.release()

    async def _exchange(self, request: httpx.Request, data: bytes,
                        timeouts: dict[str, float | None]) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        connection = await self._connection(request, timeouts.get("connect"))
        try:
            answer = await connection.exchange(request, data, timeouts.get("read"))
        except BaseException:
            connection.close()
            self.every.discard(connection)
            raise
        if connection.reusable:
            self.idle.append(connection)
        else:
            connection.close()
            self.every.discard(connection)
        return answer

    async def _connection(self, request: httpx.Request, timeout: float | None) -> _Connection:
        while self.idle:
            connection = self.idle.pop()
            if not connection.closed:
                return connection
            self.every.discard(connection)
        try:
            _, connection = await asyncio.wait_for(
                self.loop.create_connection(_Connection, self.host, self.port), timeout)
        except (TimeoutError, asyncio.TimeoutError) as exc:
            raise httpx.ConnectTimeout(f"no connection to {self.host}:{self.port} within {timeout}s",
                                       request=request) from exc
        except OSError as exc:
            raise httpx.ConnectError(f"cannot connect to {self.host}:{self.port}: {exc}", request=request) from exc
        self.every.add(connection)
        return connection

    def close(self) -> None:
        for connection in self.every:
            connection.close()
        self.every.clear()
        self.idle.clear()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: one request at a time, its answer parsed as the bytes arrive."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._loop = asyncio.get_running_loop()
        self._timer: asyncio.TimerHandle | None = None
        self.closed = False
        self.reusable = False
        self._buffer = bytearray()
        self._waiter: asyncio.Future[tuple[int, list[tuple[bytes, bytes]], bytes]] | None = None
        self._request: httpx.Request | None = None
        self._state = _DONE
        self._status = 0
        self._headers: list[tuple[bytes, bytes]] = []
        self._length = 0
        self._body = bytearray()
        self._keep_alive = True
        self._heard = 0.0  # loop time of the request's last sign of life (sent, or bytes of its answer)

    # asyncio's side

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        if self._waiter is None or self._waiter.done():
            self.close()  # bytes nobody asked for: this connection cannot be trusted with the next answer
            return
        self._buffer += data
        self._heard = self._loop.time()
        try:
            self._parse()
        except httpx.RemoteProtocolError as exc:
            self._fail(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        if self._waiter is None or self._waiter.done():
            return
        if self._state == _UNTIL_CLOSE and exc is None:
            self._body += self._buffer
            self._finish(keep_alive=False)
        elif isinstance(exc, ConnectionResetError):
            self._fail(httpx.ReadError(f"the connection was reset: {exc}", request=self._request))
        else:
            self._fail(httpx.RemoteProtocolError("the server closed the connection before its answer was whole"
                                                 + (f" ({exc})" if exc else ""), request=self._request))

    # the caller's side

    async def exchange(self, request: httpx.Request, data: bytes,
                       read_timeout: float | None) -> tuple[int, list[tuple[bytes, bytes]], bytes]:
        """Write ``data`` and wait for the whole answer, with no byte of it for at most ``read_timeout``."""
        assert self.transport is not None
        loop = self._loop
        self._waiter = waiter = loop.create_future()
        self._request, self._state, self.reusable = request, _HEAD, False
        self._heard = loop.time()
        self.transport.write(data)
        if read_timeout is not None:
            self._timer = loop.call_later(read_timeout, self._check, read_timeout)
        try:
            return await waiter
        finally:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            self._waiter = self._request = None

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

    def _check(self, read_timeout: float) -> None:
        """The read timer: fail the request if nothing came for ``read_timeout``, else look again later."""
        waiter = self._waiter
        if waiter is None or waiter.done():
            return
        quiet = self._loop.time() - self._heard
        if quiet >= read_timeout:
            self._fail(httpx.ReadTimeout(f"no answer within {read_timeout}s", request=self._request))
        else:
            self._timer = self._loop.call_later(read_timeout - quiet, self._check, read_timeout)

    def _fail(self, error: Exception) -> None:
        self.close()
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_exception(error)

    def _finish(self, *, keep_alive: bool) -> None:
        self._state = _DONE
        self.reusable = keep_alive and not self.closed and not self._buffer
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result((self._status, self._headers, bytes(self._body)))

    # parsing

    def _parse(self) -> None:
        while True:
            if self._state == _HEAD:
                if not self._read_head():
                    return
            elif self._state == _LENGTH:
                if len(self._buffer) < self._length:
                    return
                if len(self._buffer) == self._length:  # the usual answer: the body, and nothing after it
                    self._body, self._buffer = self._buffer, bytearray()
                else:
                    self._body = self._buffer[:self._length]
                    del self._buffer[:self._length]
                self._finish(keep_alive=self._keep_alive)
                return
            elif self._state == _CHUNKED:
                if not self._read_chunk():
                    return
            else:
                return  # _UNTIL_CLOSE waits for the close; _DONE takes nothing more

    def _read_head(self) -> bool:
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD_BYTES:
                raise httpx.RemoteProtocolError("the answer's head is too long", request=self._request)
            return False
        lines = bytes(self._buffer[:end]).split(b"\r\n")
        del self._buffer[:end + 4]
        version, _, rest = lines[0].partition(b" ")
        code = rest[:3]
        if not version.startswith(b"HTTP/1.") or not code.isdigit():
            raise httpx.RemoteProtocolError(f"not an HTTP/1.x answer: {lines[0][:80]!r}", request=self._request)
        status = int(code)
        headers = []
        framing, length, connection = _UNTIL_CLOSE, 0, b""
        for line in lines[1:]:
            name, colon, value = line.partition(b":")
            if not colon:
                raise httpx.RemoteProtocolError(f"a header line without a colon: {line[:80]!r}", request=self._request)
            value = value.strip()
            headers.append((name, value))
            lowered = name.lower()
            if lowered == b"content-length" and framing != _CHUNKED:
                if not value.isdigit():
                    raise httpx.RemoteProtocolError(f"Content-Length {value[:40]!r}", request=self._request)
                framing, length = _LENGTH, int(value)
            elif lowered == b"transfer-encoding" and value.lower().endswith(b"chunked"):
                framing = _CHUNKED
            elif lowered == b"connection":
                connection = value.lower()
        if 100 <= status < 200:
            return True  # an interim answer (100 Continue): the real one follows
        self._status, self._headers, self._body = status, headers, bytearray()
        self._keep_alive = b"close" not in connection and (version == b"HTTP/1.1" or b"keep-alive" in connection)
        if status in (204, 304) or (self._request is not None and self._request.method == "HEAD"):
            framing, length = _LENGTH, 0
        self._state, self._length = framing, length
        if framing == _UNTIL_CLOSE:
            self._keep_alive = False
        return True

    def _read_chunk(self) -> bool:
        end = self._buffer.find(b"\r\n")
        if end < 0:
            return False
        size_text = bytes(self._buffer[:end]).split(b";", 1)[0].strip()
        try:
            size = int(size_text, 16)
        except ValueError:
            raise httpx.RemoteProtocolError(f"a chunk size that is not hex: {size_text[:40]!r}",
                                            request=self._request) from None
        if size == 0:  # the last chunk, then trailers up to an empty line
            trailers_end = self._buffer.find(b"\r\n\r\n", end)
            if self._buffer[end:end + 4] == b"\r\n\r\n" or trailers_end >= 0:
                stop = end + 4 if self._buffer[end:end + 4] == b"\r\n\r\n" else trailers_end + 4
                del self._buffer[:stop]
                self._finish(keep_alive=self._keep_alive)
            return False
        if len(self._buffer) < end + 2 + size + 2:
            return False
        self._body += self._buffer[end + 2:end + 2 + size]
        del self._buffer[:end + 2 + size + 2]
        return True
