"""One TEI server over HTTP: the only place where httpx and TEI's answers become teibatch types.

Every httpx error and every non-200 answer is mapped here, once, to a
:class:`~teibatch.errors.TeiError` subclass (``raise ... from exc``); code elsewhere branches on
those types and their fields, never on message text. TEI's fixed error texts (docs/client.md, "What
each answer leads to") are read only in :func:`error_from_response`. A 200 is trusted no more than
the rest: a body that is not the route's JSON, and vectors of the wrong count, dimension, value or
norm, are :class:`~teibatch.errors.ServerFault` (:mod:`teibatch.tei.checks`).

Every request has one deadline for all of it (connect, send, wait, read): a server that never
answers, or trickles its answer a byte at a time, is given up after the request's timeout and the
connection is closed, not returned to the pool.

The API key goes in ``Authorization: Bearer`` (TEI compares it byte for byte) and nowhere else:
not in a message, a ``repr`` or a log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import ssl
import sys
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass

import anyio
import httpx
import numpy as np
import orjson

from teibatch.endpoint import Endpoint
from teibatch.errors import (
    InputTooLong,
    PayloadTooLarge,
    ServerFault,
    TeiAuthError,
    TeiError,
    TeiOverloaded,
    TeiRequestError,
    TeiUnavailable,
    TooManyInputs,
    WrongModelKind,
)
from teibatch.tei.checks import FAULT_BAD_BODY, check_sparse, check_vectors
from teibatch.tei.decode import ROUTE_EMBED, ROUTE_EMBED_SPARSE, ROUTE_OPENAI_BASE64, decode_sparse, decode_vectors
from teibatch.tei.info import ServerInfo

DEFAULT_TIMEOUT_S = 60.0
DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_HEALTH_TIMEOUT_S = 5.0
MIN_TOKENS_PER_S = 1_000
"""The slowest server planned for (TEI on a few CPU cores); each request's timeout grows by its
estimated tokens at this rate, so a full batch of long texts is not cut off while a tiny one still
fails fast."""
CHARS_PER_TOKEN = 4
"""A rough count of characters per token, to estimate a request's tokens without a tokenizer."""

_PATHS = {ROUTE_EMBED: "/embed", ROUTE_OPENAI_BASE64: "/v1/embeddings", ROUTE_EMBED_SPARSE: "/embed_sparse"}
_JSON_HEADERS = {"content-type": "application/json"}


@functools.cache
def tls_context() -> ssl.SSLContext:
    """httpx's default TLS settings, built once per process: each build reads the CA bundle again."""
    return httpx.create_ssl_context()


def tls_settings(*urls: str) -> ssl.SSLContext | bool:
    """The ``verify`` setting of an httpx client for ``urls``: :func:`tls_context` if one is HTTPS.

    Plain HTTP needs none, and building them costs CPU exactly when a run starts and every
    millisecond of the driver's and the senders' CPU delays the servers' first batch.
    """
    return tls_context() if any(url.startswith("https:") for url in urls) else False


@dataclass(frozen=True)
class EmbedRequest:
    """A ready-to-send request body; ``count`` inputs, ``chars`` characters in total."""

    route: str
    body: bytes
    count: int
    chars: int

    @property
    def tokens(self) -> int:
        """Estimated tokens (special tokens included), for the timeout."""
        return self.chars // CHARS_PER_TOKEN + 2 * self.count


class TeiClient:
    """Talks to one TEI server through an injected ``httpx.AsyncClient``; knows nothing of Ray or files.

    ``timeout`` is the base time allowed for any request, from connecting to the last byte of the
    answer; embed requests get more in proportion to their estimated tokens (:meth:`timeout_for`).
    ``model`` and ``api_key_env`` only make messages better: a 401 names the variable that holds
    the key, a 424 names the model. ``expected_dimension`` (``None``: any) and ``normalized``
    (vectors must have L2 norm 1, as with ``normalize: true``) are what :meth:`embed` checks its
    answers against, besides one finite vector per input; on ``/embed_sparse``,
    ``expected_dimension`` is the vocabulary size every index must stay under.
    """

    def __init__(self, endpoint: Endpoint, http: httpx.AsyncClient, *, timeout: float = DEFAULT_TIMEOUT_S,
                 model: str | None = None, api_key_env: str | None = None,
                 expected_dimension: int | None = None, normalized: bool = False) -> None:
        self.endpoint = endpoint
        self.model = model
        self.api_key_env = api_key_env
        self.expected_dimension = expected_dimension
        self.normalized = normalized
        self._http = http
        self._timeout = timeout
        self._auth = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}
        self._json = {**self._auth, **_JSON_HEADERS}
        # Each route's URL parsed once: httpx parses a string URL on every request.
        self._urls: dict[str, httpx.URL] = {}

    def __repr__(self) -> str:
        return f"TeiClient({self.endpoint!r})"

    @property
    def url(self) -> str:
        return self.endpoint.url

    def timeout_for(self, request: EmbedRequest) -> float:
        """Seconds allowed for ``request``: the base timeout plus its tokens at :data:`MIN_TOKENS_PER_S`."""
        return self._timeout + request.tokens / MIN_TOKENS_PER_S

    async def info(self, timeout: float | None = None) -> ServerInfo:
        """``GET /info``, parsed (bad limits replaced and logged, see :class:`ServerInfo`); remembers
        the model name for later messages. A body that is not a JSON object is a ``"bad body"``
        :class:`~teibatch.errors.ServerFault`."""
        response = await self._send("GET", "/info", timeout=timeout or self._timeout)
        try:
            data = orjson.loads(response.content)
            if not isinstance(data, dict):
                raise TypeError(f"a JSON {type(data).__name__}, not an object")
            info = ServerInfo.from_json(data, server=self.url)
        except (orjson.JSONDecodeError, AttributeError, TypeError, ValueError) as exc:
            raise ServerFault(f"answered /info with something that is not TEI's /info JSON ({exc}; "
                              f"body starts {_body_start(response.content)})", server=self.url,
                              kind=FAULT_BAD_BODY, status_code=response.status_code) from exc
        self.model = self.model or info.model_id
        return info

    async def healthy(self, timeout: float = DEFAULT_HEALTH_TIMEOUT_S) -> bool:
        """True when ``GET /health`` answers 200 within ``timeout``."""
        try:
            await self._send("GET", "/health", timeout=timeout)
        except TeiError:
            return False
        return True

    async def embed(self, request: EmbedRequest) -> np.ndarray:
        """Send one packed request; return its vectors (float32, one row per input, input order; on
        ``/embed_sparse``, an array of :class:`~teibatch.sparse.SparseVector`, one per input).

        Only checked vectors come back: any other answer raises a :class:`~teibatch.errors.TeiError`,
        a wrong 200 a :class:`~teibatch.errors.ServerFault` (:func:`~teibatch.tei.checks.check_vectors`).
        """
        try:
            response = await self._send("POST", _PATHS[request.route], content=request.body,
                                        headers=self._json, timeout=self.timeout_for(request))
        except WrongModelKind as exc:
            raise await self._model_error(exc, sparse=request.route == ROUTE_EMBED_SPARSE) from None
        try:
            if request.route == ROUTE_EMBED_SPARSE:
                return check_sparse(decode_sparse(response.content), count=request.count,
                                    vocab_size=self.expected_dimension, server=self.url)
            vectors = decode_vectors(request.route, response.content)
        except ValueError as exc:
            raise ServerFault(f"answered 200 to {_PATHS[request.route]} with a body that is not its JSON "
                              f"({exc}; body starts {_body_start(response.content)})",
                              server=self.url, kind=FAULT_BAD_BODY, status_code=response.status_code) from exc
        return check_vectors(vectors, count=request.count, dimension=self.expected_dimension,
                             normalized=self.normalized, server=self.url)

    async def tokenize(self, body: bytes) -> bytes:
        """``POST /tokenize`` with a ready JSON body; the answer's bytes, which
        :mod:`teibatch.tei.tokenize` reads. Every other answer raises as on any route."""
        response = await self._send("POST", "/tokenize", content=body, headers=self._json, timeout=self._timeout)
        return response.content

    async def _send(self, method: str, path: str, *, timeout: float, content: bytes | None = None,
                    headers: dict[str, str] | None = None) -> httpx.Response:
        """The one boundary for httpx: send, read the whole answer within ``timeout`` seconds in all,
        and map every failure and every non-200 answer to a :class:`~teibatch.errors.TeiError`.
        ``headers``: all of them, the key's included (default: the key's alone).

        httpx's own timeouts bound each step (connect, each read), so a server that trickles a
        byte at a time would never hit them; the deadline around the whole request does. On
        either, httpx closes the response and its connection (a half-read connection is never
        reused), so nothing is left open in the pool.
        """
        url = self._urls.get(path)
        if url is None:
            url = self._urls[path] = httpx.URL(self.url + path)
        try:
            async with _deadline(timeout):
                response = await self._http.request(method, url, content=content, headers=headers or self._auth,
                                                    timeout=_limits(timeout))
        except (TimeoutError, httpx.TimeoutException) as exc:
            raise TeiUnavailable(f"no complete answer within {timeout:.1f}s to {method} {path} (the whole request: "
                                 f"connect, send, wait, read; {type(exc).__name__})", server=self.url) from exc
        except httpx.HTTPError as exc:
            raise TeiUnavailable(f"connection failed ({type(exc).__name__}: {exc})", server=self.url) from exc
        if response.status_code == 401:
            raise self._auth_error()
        if response.status_code != 200:
            raise error_from_response(self.url, response.status_code, response.content,
                                      response.headers.get("retry-after"))
        return response

    def _auth_error(self) -> TeiAuthError:
        serving = f" (serving {self.model})" if self.model else ""
        if not self.endpoint.api_key:
            fix = ("it wants an API key and none was sent; put the key in an environment variable and name "
                   "that variable in servers.api_key_env")
        elif self.api_key_env:
            fix = f"it refused the API key; put the right key in the environment variable {self.api_key_env}"
        else:
            fix = ("it refused the API key; put the right key in the environment variable named by "
                   "servers.api_key_env")
        return TeiAuthError(f"401 Unauthorized{serving}: {fix}", server=self.url, status_code=401)

    async def _model_error(self, exc: WrongModelKind, *, sparse: bool) -> WrongModelKind:
        model, kind, pooling = self.model, "not an embedding model", None
        try:
            info = await self.info(timeout=DEFAULT_HEALTH_TIMEOUT_S)
        except TeiError:
            pass
        else:
            model, pooling = info.model_id, info.pooling
            kind = (f"an embedding model with {info.pooling} pooling" if info.model_kind == "embedding"
                    else f"a {info.model_kind} model")
        said = str(exc).removeprefix(f"{exc.server}: ")
        if sparse:
            fix = "point the job at TEI servers launched with a SPLADE model, or set model.kind: dense"
        elif pooling == "splade":
            fix = "for its sparse vectors set model.kind: sparse (or auto)"
        else:
            fix = "point the job at TEI servers launched with an embedding model (--model-id)"
        return WrongModelKind(
            f"serves {model or 'a model'}, {kind}, which cannot give {'sparse' if sparse else 'dense'} vectors "
            f"({said}); {fix}", server=self.url, status_code=exc.status_code)


@contextlib.asynccontextmanager
async def _anyio_deadline(seconds: float) -> AsyncIterator[None]:
    with anyio.fail_after(seconds):
        yield


def _deadline(seconds: float) -> AbstractAsyncContextManager[object]:
    """The deadline on a whole request: asyncio's own where there is one (3.11+), at a fraction of
    anyio's cost per request; both raise ``TimeoutError``."""
    if sys.version_info >= (3, 11):
        return asyncio.timeout(seconds)
    return _anyio_deadline(seconds)


@functools.lru_cache(maxsize=1024)
def _limits(timeout: float) -> httpx.Timeout:
    """httpx's timeouts for a request of ``timeout`` seconds in all (the connect at most
    :data:`DEFAULT_CONNECT_TIMEOUT_S`); requests of a run share a few values, so they are cached."""
    return httpx.Timeout(timeout, connect=min(timeout, DEFAULT_CONNECT_TIMEOUT_S))


def error_from_response(server: str, status: int, content: bytes, retry_after: str | None = None) -> TeiError:
    """TEI's answer as a typed error (contract: status, then ``error_type``, then TEI's fixed texts)."""
    message, error_type = _error_text(content)
    shown = message or f"HTTP {status}"
    if status == 401:
        return TeiAuthError("401 Unauthorized: the API key is missing or wrong", server=server,
                            status_code=status)
    if status == 429:
        return TeiOverloaded(shown, server=server, status_code=status, retry_after=_seconds(retry_after))
    if status == 413 and error_type is None:
        return PayloadTooLarge(shown, server=server, status_code=status)
    if status in (413, 422) and error_type == "Validation":
        # TEI's Validation errors carry fixed texts (core/src/tokenization.rs, router/src/http/server.rs).
        if message.startswith("batch size"):
            return TooManyInputs(shown, server=server, status_code=status)
        if "must have less than" in message:
            return InputTooLong(shown, server=server, status_code=status)
    if status == 424:
        if "not an embedding model" in message or "not available for SPLADE" in message:
            return WrongModelKind(shown, server=server, status_code=status)
        return TeiUnavailable(shown, server=server, status_code=status)
    if status >= 500:
        return TeiUnavailable(shown, server=server, status_code=status, retry_after=_seconds(retry_after))
    return TeiRequestError(shown, server=server, status_code=status)


def _error_text(content: bytes) -> tuple[str, str | None]:
    try:
        data = orjson.loads(content)
    except orjson.JSONDecodeError:
        return content.decode("utf-8", "replace").strip()[:500], None
    if isinstance(data, dict):
        if "error" in data:
            return str(data["error"]), data.get("error_type")
        if "message" in data:
            return str(data["message"]), data.get("type")
    return content.decode("utf-8", "replace")[:500], None


def _body_start(content: bytes, length: int = 60) -> str:
    """The start of a body for a message: ``'<html><head>…'`` or ``'' (empty)``."""
    if not content:
        return "'' (empty)"
    text = content[:length].decode("utf-8", "replace")
    return repr(text + ("…" if len(content) > length else ""))


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
