"""What a TEI server says about itself (``GET /info``) and the limits a client derives from it.

``/info`` carries every limit but one: the request body limit (``--payload-limit``) is not in it, so
it is configured per server (default 2,000,000 bytes, TEI's default). A job file may lower any limit;
it can never raise one above what the server reports.

``/info`` is not trusted blindly: a limit that is missing takes TEI's default (older servers), and
one that is present but not a positive integer (``0``, ``-1``, ``null``, ``"32"``, ``32.0``,
``true``) takes a conservative value. Each replacement is logged as a warning naming the server,
the key, the value seen and the value used, and kept in :attr:`ServerInfo.replaced` for the run
report; ``docs/client.md`` has the table.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field
from typing import Any

import orjson

logger = logging.getLogger(__name__)

DEFAULT_MAX_CLIENT_BATCH_SIZE = 32
DEFAULT_MAX_CONCURRENT_REQUESTS = 512
DEFAULT_MAX_INPUT_LENGTH = 512
DEFAULT_MAX_BATCH_TOKENS = 16_384
DEFAULT_PAYLOAD_LIMIT = 2_000_000
SAFE_MAX_CLIENT_BATCH_SIZE = 1
"""``max_client_batch_size`` when ``/info`` gives a bad one: one input a request is within any
server's limit; it slows that server only, the pool gives the work to the others."""
SAFE_MAX_CONCURRENT_REQUESTS = 32
"""``max_concurrent_requests`` when ``/info`` gives a bad one: one default-size batch in flight. Not
1: the run's shards in flight are capped by it (:attr:`ClientLimits.max_parts`), and a value still
too high only costs 429s, which halve the window."""
CHARS_PER_TOKEN_LIMIT = 250
"""TEI refuses (truncate off) or cuts (truncate on) inputs over ``max_input_length * 250`` characters."""
BASE64_SINCE = (1, 3, 0)
"""``encoding_format: base64`` on ``/v1/embeddings`` exists since TEI 1.3.0."""


@dataclass(frozen=True)
class _Limit:
    """How one ``/info`` key is read: the value used when it is missing, and when it is bad."""

    key: str
    missing: int
    invalid: int


_LIMITS = (
    _Limit("max_client_batch_size", DEFAULT_MAX_CLIENT_BATCH_SIZE, SAFE_MAX_CLIENT_BATCH_SIZE),
    _Limit("max_concurrent_requests", DEFAULT_MAX_CONCURRENT_REQUESTS, SAFE_MAX_CONCURRENT_REQUESTS),
    # Only used to refuse, without asking, texts over max_input_length * 250 characters when
    # truncation is off; 512 tokens (BERT's limit) = 128,000 characters, which TEI refuses anyway
    # for any model up to ~32,000 tokens.
    _Limit("max_input_length", DEFAULT_MAX_INPUT_LENGTH, DEFAULT_MAX_INPUT_LENGTH),
    # Not used to size requests; kept for the report.
    _Limit("max_batch_tokens", DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_BATCH_TOKENS),
)


@dataclass(frozen=True)
class ServerInfo:
    """The fields of TEI's ``/info`` that a batch client needs.

    ``replaced`` maps each key whose value was missing or bad to ``"<seen> -> <used>"`` (``seen`` as
    JSON, or ``missing``), e.g. ``{"max_client_batch_size": "0 -> 1"}``; empty for a sound ``/info``.
    """

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
    replaced: dict[str, str] = field(default_factory=dict, hash=False)

    @classmethod
    def from_json(cls, data: dict[str, Any], *, server: str | None = None) -> ServerInfo:
        """Parse ``/info`` (or :meth:`to_json`'s output) from ``server`` (its URL, for the warnings).

        Missing limits get TEI's defaults, bad ones conservative values (module docstring); each is
        logged and recorded in :attr:`replaced`.
        """
        model_type = data.get("model_type") or {data.get("model_kind", "embedding"): {"pooling": data.get("pooling")}}
        kind = next(iter(model_type), "embedding") if isinstance(model_type, dict) else str(model_type)
        details = model_type.get(kind) if isinstance(model_type, dict) else None
        pooling = details.get("pooling") if isinstance(details, dict) else None
        previous = data.get("replaced")
        replaced: dict[str, str] = dict(previous) if isinstance(previous, dict) else {}
        limits = {limit.key: _read_limit(data, limit, server, replaced) for limit in _LIMITS}
        return cls(
            model_id=str(data.get("model_id", "unknown")),
            model_kind=kind,
            pooling=pooling,
            max_client_batch_size=limits["max_client_batch_size"],
            max_concurrent_requests=limits["max_concurrent_requests"],
            max_input_length=limits["max_input_length"],
            max_batch_tokens=limits["max_batch_tokens"],
            auto_truncate=_read_auto_truncate(data, server, replaced),
            version=_read_optional_text(data, "version", server, replaced),
            model_dtype=_read_optional_text(data, "model_dtype", server, replaced),
            served_model_name=_read_optional_text(data, "served_model_name", server, replaced),
            max_batch_requests=_read_max_batch_requests(data, server, replaced),
            replaced=replaced,
        )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def supports_base64(self) -> bool:
        """Whether ``/v1/embeddings`` takes ``encoding_format: base64`` (unknown versions: assume so).

        Never when ``auto_truncate`` was missing or bad: that route truncates as the server is set
        to, so a client that does not know the setting uses ``/embed``, where it sends ``truncate``.
        """
        if "auto_truncate" in self.replaced:
            return False
        version = version_tuple(self.version)
        return version is None or version >= BASE64_SINCE


def _shown(value: object) -> str:
    """A value from ``/info`` as JSON, short: ``0``, ``null``, ``"32"``, ``true``."""
    try:
        text = orjson.dumps(value).decode()
    except TypeError:
        text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"


def _replace(server: str | None, key: str, seen: str, used: object, why: str, replaced: dict[str, str]) -> None:
    replaced[key] = f"{seen} -> {_shown(used)}"
    logger.warning("%s: /info %s is %s; using %s (%s)", server or "a TEI server", key, seen, _shown(used), why)


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _read_limit(data: dict[str, Any], limit: _Limit, server: str | None, replaced: dict[str, str]) -> int:
    """A positive integer from ``data[limit.key]``, or the value :class:`_Limit` gives instead."""
    if limit.key not in data:
        _replace(server, limit.key, "missing", limit.missing, "TEI's default", replaced)
        return limit.missing
    value = data[limit.key]
    if _positive_int(value):
        return int(value)
    _replace(server, limit.key, _shown(value), limit.invalid, "not a positive integer: the conservative value",
             replaced)
    return limit.invalid


def _read_max_batch_requests(data: dict[str, Any], server: str | None, replaced: dict[str, str]) -> int | None:
    """``max_batch_requests``: a positive integer, or ``null`` (no limit; also when missing or bad)."""
    value = data.get("max_batch_requests")
    if value is None or _positive_int(value):
        return value
    _replace(server, "max_batch_requests", _shown(value), None, "not a positive integer: unknown", replaced)
    return None


def _read_auto_truncate(data: dict[str, Any], server: str | None, replaced: dict[str, str]) -> bool:
    """``auto_truncate``; missing (older than 1.2.1, which never truncated) or not a bool: ``False``."""
    value = data.get("auto_truncate")
    if isinstance(value, bool):
        return value
    seen = "missing" if "auto_truncate" not in data else _shown(value)
    _replace(server, "auto_truncate", seen, False, "unknown: /embed with an explicit truncate is used", replaced)
    return False


def _read_optional_text(data: dict[str, Any], key: str, server: str | None, replaced: dict[str, str]) -> str | None:
    """A string or ``null``; anything else becomes ``null`` (unknown), with a warning."""
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    _replace(server, key, _shown(value), None, "not a string: treated as unknown", replaced)
    return None


def version_tuple(version: str | None) -> tuple[int, ...] | None:
    """``"1.9.3"`` → ``(1, 9, 3)``; ``None`` for a missing or unparsable version."""
    pieces = (version or "").split("-")[0].split(".")[:3]
    if not all(piece.isdigit() for piece in pieces):
        return None
    return tuple(int(piece) for piece in pieces)


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

    @property
    def max_requests(self) -> int:
        """Requests in flight at most: a full share in full batches, plus one (connections to keep)."""
        return self.max_inflight_inputs // self.max_batch_size + 1
