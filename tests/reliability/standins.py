"""Small misbehaving TEI stand-ins: servers that answer wrongly on purpose, for reliability tests.

:func:`teibatch.server.testing.running_server` is the fully TEI-compatible built-in server; a stand-in
is deliberately small (plain asyncio, one thread, HTTP/1.1 with keep-alive) and speaks just enough
TEI (``GET /health``, ``GET /info``, ``POST /embed``, ``POST /v1/embeddings`` with float or base64)
to be a server for teibatch — and then answers as its :class:`Behaviour` says, switchable while it
runs so that a test can break a server and fix it again::

    with StandIn(dimension=16) as server:          # 127.0.0.1, a free port, stopped on exit
        server.behave(Behaviour.WRONG_DIMENSION)   # every embedding answer from now on
        ...                                        # point a TeiClient at server.url
        server.behave(Behaviour.HEALTHY)           # fixed
        server.set_info(max_client_batch_size=0)   # or MISSING, None, "32"
        assert server.stats().requests["/embed"] == 2

Healthy vectors are a function of the text alone (a hash seeds them), unit length, ``dimension``
wide: :func:`vector_for` gives the expected vector. A stand-in counts requests by path, records every
text of every embedding request, and tracks inputs and connections open at once.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import enum
import hashlib
import threading
from collections import Counter
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import numpy as np
import orjson

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
MISSING: Any = object()
"""Give to :meth:`StandIn.set_info` to leave a key out of ``/info``."""


class Behaviour(str, enum.Enum):
    """How a stand-in answers ``/embed`` and ``/v1/embeddings`` (``/health`` and ``/info`` always answer)."""

    HEALTHY = "healthy"
    WRONG_DIMENSION = "wrong-dimension"
    """Vectors of ``wrong_dimension`` values (unit length)."""
    WRONG_COUNT = "wrong-count"
    """One vector fewer than inputs."""
    HTML_502 = "html-502"
    """A proxy's ``502 Bad Gateway`` HTML page."""
    HTML_200 = "html-200"
    """A proxy's HTML page, with status 200."""
    EMPTY_200 = "empty-200"
    """Status 200, empty body."""
    NON_FINITE = "non-finite"
    """NaN and +Inf in the first vector (raw float32 on base64; ``null`` on JSON, as orjson writes NaN)."""
    NOT_NORMALIZED = "not-normalized"
    """Healthy vectors times ``scale`` (norm 3 by default)."""
    HANG = "hang"
    """Reads the request, never answers, until the client leaves or the stand-in stops."""
    TRICKLE = "trickle"
    """A healthy answer sent at ``trickle_bytes_per_s``."""


@dataclass
class Stats:
    """What a stand-in saw, as of :meth:`StandIn.stats`."""

    requests: Counter[str] = field(default_factory=Counter)
    """Requests by path (``/embed``, ``/info`` ...), whatever the answer."""
    texts: list[str] = field(default_factory=list)
    """Every text of every embedding request, in arrival order."""
    inputs_in_flight: int = 0
    max_inputs_in_flight: int = 0
    open_connections: int = 0
    max_open_connections: int = 0


def vector_for(text: str, dimension: int) -> np.ndarray:
    """The healthy vector of ``text``: float32, unit length, seeded by its SHA-256."""
    seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
    vector = np.random.default_rng(seed).standard_normal(dimension).astype(np.float32)
    return vector / np.float32(np.linalg.norm(vector))


class StandIn:
    """One misbehaving TEI server on ``127.0.0.1`` in a background thread; start/stop or ``with``.

    ``behaviour`` and ``info`` (``/info`` keys to override; :data:`MISSING` removes one) can be
    changed at any time with :meth:`behave` and :meth:`set_info`, the healthy dimension with
    :meth:`resize`. ``healthy_first`` embedding requests are answered healthy whatever the behaviour
    (a server that goes wrong after teibatch met it with a probe). Starting and stopping are bounded
    (:data:`START_TIMEOUT_S`, :data:`STOP_TIMEOUT_S`); stopping ends hung and trickling answers.
    """

    def __init__(self, behaviour: Behaviour = Behaviour.HEALTHY, *, dimension: int = 16,
                 wrong_dimension: int | None = None, trickle_bytes_per_s: int = 1, scale: float = 3.0,
                 info: dict[str, Any] | None = None, healthy_first: int = 0) -> None:
        self.dimension = dimension
        self._healthy_first = healthy_first
        self.wrong_dimension = wrong_dimension if wrong_dimension is not None else dimension // 2
        self.trickle_bytes_per_s = trickle_bytes_per_s
        self.scale = scale
        self._behaviour = behaviour
        self._info_overrides: dict[str, Any] = dict(info or {})
        self._lock = threading.Lock()
        self._stats = Stats()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._port: int | None = None

    # -- control, from the test's thread --------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, from :meth:`start` on (and still after :meth:`stop`)."""
        if self._port is None:
            raise RuntimeError("the stand-in was never started")
        return f"http://127.0.0.1:{self._port}"

    def behave(self, behaviour: Behaviour) -> None:
        """Answer every embedding request from now on as ``behaviour`` says."""
        with self._lock:
            self._behaviour = behaviour

    def resize(self, dimension: int) -> None:
        """Serve vectors of ``dimension`` from now on (a server restarted with another model size)."""
        with self._lock:
            self.dimension = dimension

    def set_info(self, **overrides: Any) -> None:
        """Override ``/info`` keys (added to earlier overrides); :data:`MISSING` leaves a key out."""
        with self._lock:
            self._info_overrides.update(overrides)

    def stats(self) -> Stats:
        """A copy of the counters as they are now."""
        with self._lock:
            s = self._stats
            return Stats(Counter(s.requests), list(s.texts), s.inputs_in_flight, s.max_inputs_in_flight,
                         s.open_connections, s.max_open_connections)

    def start(self) -> StandIn:
        """Listen on a free port of 127.0.0.1; returns once it accepts connections."""
        if self._thread is not None:
            raise RuntimeError("the stand-in is already running")
        ready = threading.Event()
        failure: list[BaseException] = []

        def main() -> None:
            try:
                asyncio.run(self._serve(ready))
            except BaseException as exc:  # reported to the starting thread
                failure.append(exc)
                ready.set()

        self._thread = threading.Thread(target=main, name="tei-stand-in", daemon=True)
        self._thread.start()
        if not ready.wait(START_TIMEOUT_S) or failure:
            self.stop()
            raise RuntimeError(f"the stand-in did not start: {failure[0] if failure else 'timed out'}")
        return self

    def stop(self) -> None:
        """Stop listening, end every open connection (hung ones too) and join the thread."""
        thread, loop, stop = self._thread, self._loop, self._stop
        if thread is None:
            return
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has already ended
                loop.call_soon_threadsafe(stop.set)
        thread.join(STOP_TIMEOUT_S)
        if thread.is_alive():
            raise RuntimeError(f"the stand-in at port {self._port} did not stop within {STOP_TIMEOUT_S}s")
        self._thread = self._loop = self._stop = None  # the port stays: url names it in messages

    def __enter__(self) -> StandIn:
        return self.start()

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()

    # -- the server, in its own thread and loop -------------------------------------------------

    async def _serve(self, ready: threading.Event) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        connections: set[asyncio.Task[None]] = set()

        async def accept(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            task = asyncio.current_task()
            assert task is not None
            connections.add(task)
            try:
                await self._connection(reader, writer)
            except asyncio.CancelledError:
                pass  # stopping; a handler task that ends cancelled is logged by asyncio as an error
            finally:
                connections.discard(task)

        server = await asyncio.start_server(accept, "127.0.0.1", 0)
        self._port = int(server.sockets[0].getsockname()[1])
        ready.set()
        async with server:
            await self._stop.wait()
            server.close()
            for task in list(connections):
                task.cancel()
            await asyncio.gather(*connections, return_exceptions=True)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._count_connection(+1)
        try:
            while True:
                request = await _read_request(reader)
                if request is None:
                    return
                method, path, body = request
                with self._lock:
                    self._stats.requests[path] += 1
                if not await self._answer(method, path, body, reader, writer):
                    return
        except (ConnectionError, asyncio.IncompleteReadError, ValueError, KeyError, TypeError):
            return  # the client left, or sent what a stand-in does not read: end the connection
        finally:
            self._count_connection(-1)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(self, method: str, path: str, body: bytes, reader: asyncio.StreamReader,
                      writer: asyncio.StreamWriter) -> bool:
        """Write one answer; ``False`` when the connection must end (hung or trickled answers)."""
        if method == "GET" and path == "/health":
            await _respond(writer, 200, b"", "text/plain")
        elif method == "GET" and path == "/info":
            await _respond(writer, 200, orjson.dumps(self._info()), "application/json")
        elif method == "POST" and path in ("/embed", "/v1/embeddings"):
            return await self._embed(path, body, reader, writer)
        else:
            await _respond(writer, 404, b"", "text/plain")
        return True

    def _info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "model_id": "stand-in/hashing", "model_sha": None, "model_dtype": "float32",
            "served_model_name": "stand-in/hashing", "model_type": {"embedding": {"pooling": "mean"}},
            "max_concurrent_requests": 512, "max_input_length": 512, "max_batch_tokens": 16384,
            "max_batch_requests": None, "max_client_batch_size": 32, "auto_truncate": True,
            "tokenization_workers": 1, "version": "1.9.3", "sha": None, "docker_label": None}
        with self._lock:
            for key, value in self._info_overrides.items():
                if value is MISSING:
                    info.pop(key, None)
                else:
                    info[key] = value
        return info

    async def _embed(self, path: str, body: bytes, reader: asyncio.StreamReader,
                     writer: asyncio.StreamWriter) -> bool:
        request = orjson.loads(body)
        openai = path == "/v1/embeddings"
        inputs = request["input"] if openai else request["inputs"]
        texts = [inputs] if isinstance(inputs, str) else [str(text) for text in inputs]
        with self._lock:
            behaviour = self._behaviour
            if self._healthy_first > 0:  # a server that goes wrong only after it has been met
                self._healthy_first -= 1
                behaviour = Behaviour.HEALTHY
            dimension = self.dimension
            self._stats.texts.extend(texts)
            self._stats.inputs_in_flight += len(texts)
            self._stats.max_inputs_in_flight = max(self._stats.max_inputs_in_flight, self._stats.inputs_in_flight)
        counted = True
        try:
            if behaviour is Behaviour.HANG:
                await _until_client_leaves(reader)
                return False
            if behaviour is Behaviour.HTML_502:
                await _respond(writer, 502, _HTML_502, "text/html")
                return True
            if behaviour is Behaviour.HTML_200:
                await _respond(writer, 200, _HTML_502, "text/html")
                return True
            if behaviour is Behaviour.EMPTY_200:
                await _respond(writer, 200, b"", "application/json")
                return True
            content = _embeddings_body(self._vectors(behaviour, texts, dimension), openai=openai,
                                       as_base64=openai and request.get("encoding_format") == "base64")
            if behaviour is Behaviour.TRICKLE:
                await _trickle(writer, reader, content, self.trickle_bytes_per_s)
                return False
            # Out of flight once computed, before the answer is written, as TEI releases its permits: a
            # client that has read the answer then never sees these inputs still counted.
            with self._lock:
                self._stats.inputs_in_flight -= len(texts)
            counted = False
            await _respond(writer, 200, content, "application/json")
            return True
        finally:
            if counted:
                with self._lock:
                    self._stats.inputs_in_flight -= len(texts)

    def _vectors(self, behaviour: Behaviour, texts: list[str], dimension: int) -> np.ndarray:
        dimension = self.wrong_dimension if behaviour is Behaviour.WRONG_DIMENSION else dimension
        vectors = np.stack([vector_for(text, dimension) for text in texts])
        if behaviour is Behaviour.WRONG_COUNT:
            vectors = vectors[:-1]
        elif behaviour is Behaviour.NOT_NORMALIZED:
            vectors = vectors * np.float32(self.scale)
        elif behaviour is Behaviour.NON_FINITE:
            vectors[0, 0], vectors[0, -1] = np.nan, np.inf
        return vectors

    def _count_connection(self, change: int) -> None:
        with self._lock:
            self._stats.open_connections += change
            self._stats.max_open_connections = max(self._stats.max_open_connections, self._stats.open_connections)


_HTML_502 = (b"<html>\r\n<head><title>502 Bad Gateway</title></head>\r\n<body>\r\n"
             b"<center><h1>502 Bad Gateway</h1></center>\r\n<hr><center>nginx</center>\r\n</body>\r\n</html>\r\n")
_REASONS = {200: "OK", 404: "Not Found", 502: "Bad Gateway"}


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str, bytes] | None:
    """One HTTP/1.1 request (``Content-Length`` bodies only); ``None`` when the client closed."""
    line = await reader.readline()
    if not line:
        return None
    method, target, _ = line.decode("latin-1").split(" ", 2)
    length = 0
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        if name.strip().lower() == "content-length":
            length = int(value.strip())
    body = await reader.readexactly(length) if length else b""
    return method, target.split("?", 1)[0], body


def _head(status: int, length: int, content_type: str) -> bytes:
    return (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\ncontent-type: {content_type}\r\n"
            f"content-length: {length}\r\n\r\n").encode("latin-1")


async def _respond(writer: asyncio.StreamWriter, status: int, content: bytes, content_type: str) -> None:
    writer.write(_head(status, len(content), content_type) + content)
    await writer.drain()


async def _until_client_leaves(reader: asyncio.StreamReader) -> None:
    """Wait for the client to close its end (or for cancellation when the stand-in stops)."""
    while await reader.read(65536):
        pass


async def _trickle(writer: asyncio.StreamWriter, reader: asyncio.StreamReader, content: bytes,
                   bytes_per_s: int) -> None:
    """Send a 200 answer's head at once, then its body ``bytes_per_s`` a second, in tenths of a second,
    until it is all sent or the client leaves."""
    writer.write(_head(200, len(content), "application/json"))
    await writer.drain()
    left = asyncio.ensure_future(_until_client_leaves(reader))
    step = max(1, bytes_per_s // 10)
    try:
        for start in range(0, len(content), step):
            if left.done():
                return
            writer.write(content[start:start + step])
            await writer.drain()
            await asyncio.sleep(step / bytes_per_s)
    finally:
        left.cancel()


def _embeddings_body(vectors: np.ndarray, *, openai: bool, as_base64: bool) -> bytes:
    if not openai:
        return orjson.dumps(vectors.tolist())  # NaN and Inf become null, as orjson writes them
    data = []
    for index, vector in enumerate(vectors):
        embedding: object = (base64.b64encode(vector.astype("<f4").tobytes()).decode() if as_base64
                             else vector.tolist())
        data.append({"object": "embedding", "embedding": embedding, "index": index})
    return orjson.dumps({"object": "list", "data": data, "model": "stand-in/hashing",
                         "usage": {"prompt_tokens": 0, "total_tokens": 0}})
