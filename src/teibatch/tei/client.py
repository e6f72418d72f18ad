"""One TEI server over HTTP: the only place where httpx and TEI's answers become teibatch types."""

from __future__ import annotations

import base64
from dataclasses import dataclass

import httpx
import numpy as np
import orjson

from teibatch.endpoint import Endpoint
from teibatch.errors import (
    InputTooLong,
    PayloadTooLarge,
    TeiAuthError,
    TeiError,
    TeiOverloaded,
    TeiRequestError,
    TeiUnavailable,
    TooManyInputs,
    WrongModelKind,
)
from teibatch.tei.info import ServerInfo

ROUTE_EMBED = "embed"
ROUTE_OPENAI_BASE64 = "openai-base64"
_PATHS = {ROUTE_EMBED: "/embed", ROUTE_OPENAI_BASE64: "/v1/embeddings"}
_JSON_HEADERS = {"content-type": "application/json"}


@dataclass(frozen=True)
class EmbedRequest:
    """A ready-to-send request body; ``count`` inputs, ``chars`` characters in total."""

    route: str
    body: bytes
    count: int
    chars: int


class TeiClient:
    """Talks to one TEI server through an injected ``httpx.AsyncClient``; knows nothing of Ray or files."""

    def __init__(self, endpoint: Endpoint, http: httpx.AsyncClient, *, timeout: float = 60.0) -> None:
        self.endpoint = endpoint
        self._http = http
        self._timeout = timeout
        self._auth = {"authorization": f"Bearer {endpoint.api_key}"} if endpoint.api_key else {}

    def __repr__(self) -> str:
        return f"TeiClient({self.endpoint!r})"

    @property
    def url(self) -> str:
        return self.endpoint.url

    async def info(self) -> ServerInfo:
        """``GET /info``, parsed."""
        response = await self._send("GET", "/info", timeout=self._timeout)
        return ServerInfo.from_json(orjson.loads(response.content))

    async def healthy(self, timeout: float = 5.0) -> bool:
        """True when ``GET /health`` answers 200 within ``timeout``."""
        try:
            await self._send("GET", "/health", timeout=timeout)
        except TeiError:
            return False
        return True

    async def embed(self, request: EmbedRequest) -> np.ndarray:
        """Send one packed request; return its vectors (float32, one row per input, input order)."""
        # Timeouts grow with the work in the request: a full batch of long texts takes longer.
        timeout = self._timeout + request.chars / 20_000
        response = await self._send("POST", _PATHS[request.route], content=request.body,
                                    headers=_JSON_HEADERS, timeout=timeout)
        vectors = decode_vectors(request.route, response.content)
        if vectors.shape[0] != request.count:
            raise TeiUnavailable(f"answered {vectors.shape[0]} vectors for {request.count} inputs",
                                 server=self.url, status_code=response.status_code)
        return vectors

    async def _send(self, method: str, path: str, *, timeout: float, content: bytes | None = None,
                    headers: dict[str, str] | None = None) -> httpx.Response:
        try:
            response = await self._http.request(method, self.url + path, content=content,
                                                headers={**self._auth, **(headers or {})}, timeout=timeout)
        except httpx.TimeoutException as exc:
            raise TeiUnavailable(f"no answer within {timeout:.0f}s ({type(exc).__name__})",
                                 server=self.url) from exc
        except httpx.HTTPError as exc:
            raise TeiUnavailable(f"connection failed ({type(exc).__name__}: {exc})", server=self.url) from exc
        if response.status_code != 200:
            raise error_from_response(self.url, response.status_code, response.content,
                                      response.headers.get("retry-after"))
        return response


def decode_vectors(route: str, content: bytes) -> np.ndarray:
    """Vectors from a 200 answer of ``/embed`` (JSON floats) or ``/v1/embeddings`` (base64 float32)."""
    data = orjson.loads(content)
    if route == ROUTE_EMBED:
        return np.asarray(data, dtype=np.float32)
    rows = sorted(data["data"], key=lambda item: item["index"])
    raw = b"".join(base64.b64decode(row["embedding"]) for row in rows)
    return np.frombuffer(raw, dtype="<f4").reshape(len(rows), -1)


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


def _seconds(value: str | None) -> float | None:
    try:
        return float(value) if value else None
    except ValueError:
        return None
