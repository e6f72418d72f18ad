"""Request bodies: every input encoded once, bodies assembled from the encoded pieces.

The body size is measured on the exact bytes that are sent: a body is its route's frame (the
option fields) plus the already-encoded inputs joined by commas, so the size counted here and the
``Content-Length`` on the wire are the same number. Which inputs go together is decided by the
embedder, per server, at send time (:mod:`teibatch.tei.work`); :meth:`RequestPacker.pack` is the
simple greedy packing for callers that send a fixed list (the pipeline's probe, tests).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

import orjson

from teibatch.sparse import KIND_AUTO, KIND_SPARSE, KINDS
from teibatch.tei.client import EmbedRequest
from teibatch.tei.decode import ROUTE_EMBED, ROUTE_EMBED_SPARSE, ROUTE_OPENAI_BASE64
from teibatch.tei.info import ServerInfo

ROUTE_AUTO = "auto"
PROBE_TEXT = "teibatch probe: is this server ready to embed?"
ON_TOO_LONG_REJECT = "reject"
ON_TOO_LONG_TRUNCATE = "truncate"


@dataclass(frozen=True)
class EmbedOptions:
    """Per-request options that change the vectors; ``truncate`` is always sent explicitly.

    ``on_too_long`` matters only with ``truncate=False``: ``reject`` (default) rejects a text the
    server refuses as too long (422) or that cannot fit the payload limit; ``truncate`` embeds it
    truncated instead (resent alone with ``truncate: true``) and flags it ``truncated``.

    ``kind``: ``sparse`` sends ``/embed_sparse`` (``normalize`` and ``dimensions`` do not apply there),
    ``dense`` the dense routes, ``auto`` whichever the servers' model gives (:func:`choose_route`).
    """

    normalize: bool = True
    truncate: bool = True
    truncation_direction: str = "right"
    prompt_name: str | None = None
    dimensions: int | None = None
    on_too_long: str = ON_TOO_LONG_REJECT
    kind: str = KIND_AUTO

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"kind must be one of {', '.join(KINDS)}")
        if self.on_too_long not in (ON_TOO_LONG_REJECT, ON_TOO_LONG_TRUNCATE):
            raise ValueError(f"on_too_long must be {ON_TOO_LONG_REJECT!r} or {ON_TOO_LONG_TRUNCATE!r}")

    @property
    def may_truncate(self) -> bool:
        """Whether a text may be embedded cut short rather than rejected."""
        return self.truncate or self.on_too_long == ON_TOO_LONG_TRUNCATE


def choose_route(requested: str, options: EmbedOptions, info: ServerInfo) -> str:
    """The route to use: ``auto`` picks base64 only where its fixed semantics equal the job's.

    Sparse vectors have one route, ``/embed_sparse``: taken with ``kind: sparse``, and with ``kind:
    auto`` when ``/info`` says the model pools with SPLADE. For dense ones, ``/v1/embeddings`` always
    normalizes, truncates as the server's ``--auto-truncate`` says, cuts on the right and takes no
    ``prompt_name``; anything else, or a server older than TEI 1.3.0 (no base64), needs ``/embed``.
    """
    if options.kind == KIND_SPARSE or (options.kind == KIND_AUTO and info.pooling == "splade"):
        return ROUTE_EMBED_SPARSE
    if requested != ROUTE_AUTO:
        return requested
    same = (options.normalize and options.prompt_name is None
            and options.truncation_direction == "right" and options.truncate == info.auto_truncate)
    return ROUTE_OPENAI_BASE64 if same and info.supports_base64 else ROUTE_EMBED


@dataclass(frozen=True)
class Batch:
    """Documents (by position in the caller's list) travelling together in one request."""

    positions: tuple[int, ...]
    request: EmbedRequest


class RequestPacker:
    """Encodes texts and assembles bodies for one route and one set of options.

    ``max_batch_size`` and ``payload_limit`` cap every request built here; when the embedder sends
    to a server, that server's own (possibly smaller) limits apply too.
    """

    def __init__(self, route: str, options: EmbedOptions, *, max_batch_size: int, payload_limit: int) -> None:
        self.route = route
        self.options = options
        self.max_batch_size = max_batch_size
        self.payload_limit = payload_limit
        self._prefix, self._suffix = _body_frame(route, options)

    @property
    def overhead(self) -> int:
        """Bytes of a body besides its inputs."""
        return len(self._prefix) + len(self._suffix)

    @staticmethod
    def encode(text: str) -> bytes:
        """One input as it appears in the body (a JSON string)."""
        return orjson.dumps(text)

    def fits_alone(self, encoded: bytes, payload_limit: int | None = None) -> bool:
        return self.overhead + len(encoded) <= (payload_limit or self.payload_limit)

    def request(self, encoded: Sequence[bytes], chars: int) -> EmbedRequest:
        """The request carrying ``encoded`` inputs (``chars`` characters in all), in that order."""
        body = self._prefix + b",".join(encoded) + self._suffix
        return EmbedRequest(route=self.route, body=body, count=len(encoded), chars=chars)

    def probe(self) -> EmbedRequest:
        """A one-text request with this packer's options: asks a server whether it embeds correctly."""
        return self.request([self.encode(PROBE_TEXT)], len(PROBE_TEXT))

    def truncating(self) -> RequestPacker:
        """A packer for resending refused texts with ``truncate: true`` (``/embed``, or ``/embed_sparse``
        for sparse vectors: the routes that take it)."""
        options = replace(self.options, truncate=True)
        route = ROUTE_EMBED_SPARSE if self.route == ROUTE_EMBED_SPARSE else ROUTE_EMBED
        return RequestPacker(route, options, max_batch_size=self.max_batch_size,
                             payload_limit=self.payload_limit)

    def cut_to_fit(self, text: str, payload_limit: int) -> str:
        """The longest part of ``text`` (its start, or its end when truncating left) that fits alone.

        Found by bisection on the character count, measuring the encoded bytes each time.
        """
        room = payload_limit - self.overhead
        keep_end = self.options.truncation_direction == "left"

        def piece(n: int) -> str:
            return text[len(text) - n:] if keep_end else text[:n]

        low, high = 0, len(text)
        while low < high:
            middle = (low + high + 1) // 2
            if len(orjson.dumps(piece(middle))) <= room:
                low = middle
            else:
                high = middle - 1
        return piece(low)

    def pack(self, items: Iterable[tuple[int, str]]) -> Iterator[Batch]:
        """Greedy packing in input order; callers drop items that don't :meth:`fits_alone` first."""
        positions: list[int] = []
        encoded: list[bytes] = []
        chars = 0
        size = self.overhead
        for position, text in items:
            piece = orjson.dumps(text)
            extra = len(piece) + (1 if encoded else 0)
            if encoded and (len(encoded) >= self.max_batch_size or size + extra > self.payload_limit):
                yield Batch(tuple(positions), self.request(encoded, chars))
                positions, encoded, chars, size = [], [], 0, self.overhead
                extra = len(piece)
            positions.append(position)
            encoded.append(piece)
            chars += len(text)
            size += extra
        if encoded:
            yield Batch(tuple(positions), self.request(encoded, chars))

    def split(self, batch: Batch, texts: Sequence[str]) -> list[Batch]:
        """Two halves of ``batch`` (``texts`` indexed by position)."""
        middle = len(batch.positions) // 2
        halves = (batch.positions[:middle], batch.positions[middle:])
        return [self.build(half, texts) for half in halves if half]

    def build(self, positions: Sequence[int], texts: Sequence[str]) -> Batch:
        encoded = [orjson.dumps(texts[p]) for p in positions]
        request = self.request(encoded, sum(len(texts[p]) for p in positions))
        return Batch(positions=tuple(positions), request=request)


def _body_frame(route: str, options: EmbedOptions) -> tuple[bytes, bytes]:
    if route in (ROUTE_EMBED, ROUTE_EMBED_SPARSE):
        fields: dict[str, object] = {
            "truncate": options.truncate,
            "truncation_direction": options.truncation_direction.capitalize(),
        }
        if route == ROUTE_EMBED:
            fields["normalize"] = options.normalize
        if options.prompt_name is not None:
            fields["prompt_name"] = options.prompt_name
        key = b'{"inputs":['
    elif route == ROUTE_OPENAI_BASE64:
        fields = {"encoding_format": "base64"}
        key = b'{"input":['
    else:
        raise ValueError(f"unknown route {route!r}")
    if options.dimensions is not None and route != ROUTE_EMBED_SPARSE:
        fields["dimensions"] = options.dimensions
    rest = orjson.dumps(fields)
    return key, b"]," + rest[1:]
