"""Request packing: turn texts into request bodies that stay under every size limit TEI enforces.

The body size is measured on the exact bytes that are sent: the body is assembled from the
already-encoded inputs, so the count here and the ``Content-Length`` on the wire are the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import orjson

from teibatch.tei.client import ROUTE_EMBED, ROUTE_OPENAI_BASE64, EmbedRequest
from teibatch.tei.info import ServerInfo

ROUTE_AUTO = "auto"


@dataclass(frozen=True)
class EmbedOptions:
    """Per-request options that change the vectors; ``truncate`` is always sent explicitly."""

    normalize: bool = True
    truncate: bool = True
    truncation_direction: str = "right"
    prompt_name: str | None = None
    dimensions: int | None = None


def choose_route(requested: str, options: EmbedOptions, info: ServerInfo) -> str:
    """The route to use: ``auto`` picks base64 only where its fixed semantics equal the job's.

    ``/v1/embeddings`` always normalizes, truncates as the server's ``--auto-truncate`` says, cuts on
    the right and takes no ``prompt_name``; anything else needs ``/embed``.
    """
    if requested != ROUTE_AUTO:
        return requested
    same = (options.normalize and options.prompt_name is None
            and options.truncation_direction == "right" and options.truncate == info.auto_truncate)
    return ROUTE_OPENAI_BASE64 if same else ROUTE_EMBED


@dataclass(frozen=True)
class Batch:
    """Documents (by position in the caller's list) travelling together in one request."""

    positions: tuple[int, ...]
    request: EmbedRequest
    attempt: int = 0


class RequestPacker:
    """Packs texts into requests of at most ``max_batch_size`` inputs and ``payload_limit`` bytes."""

    def __init__(self, route: str, options: EmbedOptions, *, max_batch_size: int, payload_limit: int) -> None:
        self.route = route
        self.max_batch_size = max_batch_size
        self.payload_limit = payload_limit
        self._prefix, self._suffix = _body_frame(route, options)

    @property
    def overhead(self) -> int:
        """Bytes of a body besides its inputs."""
        return len(self._prefix) + len(self._suffix)

    def fits_alone(self, encoded: bytes) -> bool:
        return self.overhead + len(encoded) <= self.payload_limit

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
                yield self._batch(positions, encoded, chars)
                positions, encoded, chars, size = [], [], 0, self.overhead
                extra = len(piece)
            positions.append(position)
            encoded.append(piece)
            chars += len(text)
            size += extra
        if encoded:
            yield self._batch(positions, encoded, chars)

    def split(self, batch: Batch, texts: Sequence[str]) -> list[Batch]:
        """Two halves of ``batch`` (``texts`` indexed by position), each counted as a fresh attempt."""
        middle = len(batch.positions) // 2
        halves = (batch.positions[:middle], batch.positions[middle:])
        return [self.build(half, texts) for half in halves if half]

    def build(self, positions: Sequence[int], texts: Sequence[str], attempt: int = 0) -> Batch:
        encoded = [orjson.dumps(texts[p]) for p in positions]
        return self._batch(list(positions), encoded, sum(len(texts[p]) for p in positions), attempt)

    def _batch(self, positions: list[int], encoded: list[bytes], chars: int, attempt: int = 0) -> Batch:
        body = self._prefix + b",".join(encoded) + self._suffix
        request = EmbedRequest(route=self.route, body=body, count=len(encoded), chars=chars)
        return Batch(positions=tuple(positions), request=request, attempt=attempt)


def _body_frame(route: str, options: EmbedOptions) -> tuple[bytes, bytes]:
    if route == ROUTE_EMBED:
        fields: dict[str, object] = {
            "truncate": options.truncate,
            "truncation_direction": options.truncation_direction.capitalize(),
            "normalize": options.normalize,
        }
        if options.prompt_name is not None:
            fields["prompt_name"] = options.prompt_name
        key = b'{"inputs":['
    elif route == ROUTE_OPENAI_BASE64:
        fields = {"encoding_format": "base64"}
        key = b'{"input":['
    else:
        raise ValueError(f"unknown route {route!r}")
    if options.dimensions is not None:
        fields["dimensions"] = options.dimensions
    rest = orjson.dumps(fields)
    return key, b"]," + rest[1:]
