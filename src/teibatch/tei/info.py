"""What a TEI server says about itself (``GET /info``) and the limits a client derives from it.

``/info`` carries every limit but one: the request body limit (``--payload-limit``) is not in it, so
it is configured per server (default 2,000,000 bytes, TEI's default). A job file may lower any limit;
it can never raise one above what the server reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
DEFAULT_MAX_INPUT_LENGTH = 512
DEFAULT_PAYLOAD_LIMIT = 2_000_000
CHARS_PER_TOKEN_LIMIT = 250
"""TEI refuses (truncate off) or cuts (truncate on) inputs over ``max_input_length * 250`` characters."""
BASE64_SINCE = (1, 3, 0)
"""``encoding_format: base64`` on ``/v1/embeddings`` exists since TEI 1.3.0."""


@dataclass(frozen=True)
class ServerInfo:
    """The fields of TEI's ``/info`` that a batch client needs."""

    model_id: str
    model_kind: str
    pooling: str | None
    max_client_batch_size: int
    max_concurrent_requests: int
    max_input_length: int
    max_batch_tokens: int | None
    auto_truncate: bool
    version: str | None
    model_dtype: str | None = None
    served_model_name: str | None = None
    max_batch_requests: int | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ServerInfo:
        """Parse ``/info`` (or :meth:`to_json`'s output); fields older servers lack get TEI's defaults."""
        model_type = data.get("model_type") or {data.get("model_kind", "embedding"): {"pooling": data.get("pooling")}}
        kind = next(iter(model_type), "embedding") if isinstance(model_type, dict) else str(model_type)
        details = model_type.get(kind) if isinstance(model_type, dict) else None
        pooling = details.get("pooling") if isinstance(details, dict) else None
        return cls(
            model_id=str(data.get("model_id", "unknown")),
            model_kind=kind,
            pooling=pooling,
            max_client_batch_size=int(data.get("max_client_batch_size") or DEFAULT_MAX_CLIENT_BATCH_SIZE),
            max_concurrent_requests=int(data.get("max_concurrent_requests") or DEFAULT_MAX_CONCURRENT_REQUESTS),
            max_input_length=int(data.get("max_input_length") or DEFAULT_MAX_INPUT_LENGTH),
            max_batch_tokens=data.get("max_batch_tokens"),
            # /info has carried auto_truncate since 1.2.1; older servers never truncated by default.
            auto_truncate=bool(data.get("auto_truncate", False)),
            version=data.get("version"),
            model_dtype=data.get("model_dtype"),
            served_model_name=data.get("served_model_name"),
            max_batch_requests=data.get("max_batch_requests"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "model_id": self.model_id, "model_kind": self.model_kind, "pooling": self.pooling,
            "max_client_batch_size": self.max_client_batch_size,
            "max_concurrent_requests": self.max_concurrent_requests,
            "max_input_length": self.max_input_length, "max_batch_tokens": self.max_batch_tokens,
            "auto_truncate": self.auto_truncate, "version": self.version, "model_dtype": self.model_dtype,
            "served_model_name": self.served_model_name, "max_batch_requests": self.max_batch_requests,
        }

    @property
    def supports_base64(self) -> bool:
        """Whether ``/v1/embeddings`` takes ``encoding_format: base64`` (unknown versions: assume so)."""
        version = version_tuple(self.version)
        return version is None or version >= BASE64_SINCE


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"1.9.3"`` → ``(1, 9, 3)``; ``None`` for a missing or unparsable version."""
    if not version:
        return None
    parts = []
    for piece in version.split("-")[0].split(".")[:3]:
        if not piece.isdigit():
            return None
        parts.append(int(piece))
    return tuple(parts)


@dataclass(frozen=True)
class ClientLimits:
    """The limits one client obeys towards one server: the smaller of the server's and the job's.

    ``max_input_chars`` is TEI's character limit per input (``max_input_length * 250``), ``None``
    when unknown; with truncation off, longer texts are refused without asking the server.
    """

    max_batch_size: int
    max_inflight_inputs: int
    payload_limit: int
    max_input_chars: int | None = None

    @classmethod
    def derive(cls, info: ServerInfo, *, max_batch_size: int | None = None,
               max_inflight_inputs: int | None = None,
               payload_limit: int = DEFAULT_PAYLOAD_LIMIT,
               max_input_length: int | None = None) -> ClientLimits:
        """Effective limits: each job override can only lower what the server allows."""
        batch = min(info.max_client_batch_size, max_batch_size or info.max_client_batch_size)
        inflight = min(info.max_concurrent_requests, max_inflight_inputs or info.max_concurrent_requests)
        length = min(info.max_input_length, max_input_length or info.max_input_length)
        return cls(max_batch_size=max(1, batch), max_inflight_inputs=max(1, inflight),
                   payload_limit=payload_limit, max_input_chars=length * CHARS_PER_TOKEN_LIMIT)

    def share(self, parts: int) -> ClientLimits:
        """These limits for one of ``parts`` clients that talk to the same server at once.

        The server counts inputs in flight across every client, so each gets ``1/parts`` of them
        (rounded down): ``parts`` clients together never exceed ``max_inflight_inputs``. That holds
        only while ``parts <= max_inflight_inputs`` (each client needs at least one input); the
        caller keeps ``parts`` at or under it (see :attr:`max_parts`).
        """
        inflight = max(1, self.max_inflight_inputs // max(1, parts))
        return ClientLimits(max_batch_size=min(self.max_batch_size, inflight),
                            max_inflight_inputs=inflight, payload_limit=self.payload_limit,
                            max_input_chars=self.max_input_chars)

    @property
    def max_parts(self) -> int:
        """The most clients that can share this server without breaking its in-flight limit."""
        return self.max_inflight_inputs
