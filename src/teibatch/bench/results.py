"""What one setting measured: each server's rates and all servers' totals, latencies and errors by kind.

Measuring (:mod:`teibatch.bench.measure`) records an :class:`Answer` per request; the functions here
turn the answers inside a setting's window into a :class:`ServerResult` per server, and show results
in words.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from teibatch.bench.grid import Setting

UNANSWERED = "unanswered"


@dataclass(frozen=True)
class ServerResult:
    """One server's share of a setting."""

    url: str
    documents_per_s: float
    tokens_per_s: float
    latency_p50_ms: float | None
    errors: dict[str, int]

    def to_json(self) -> dict[str, Any]:
        """The server's share as the ``--json`` output writes it (rates rounded to 0.1)."""
        return {"url": self.url, "documents_per_s": round(self.documents_per_s, 1),
                "tokens_per_s": round(self.tokens_per_s, 1), "latency_p50_ms": self.latency_p50_ms,
                "errors": self.errors}


@dataclass(frozen=True)
class SettingResult:
    """What all servers did in one setting's window of ``seconds``: ``requests``, ``documents`` and
    ``tokens`` answered inside it, the rates (see :func:`server_result`), latencies and errors by kind."""

    setting: Setting
    seconds: float
    requests: int
    documents: int
    tokens: int
    latency_ms: dict[str, float | None]
    errors: dict[str, int]
    servers: tuple[ServerResult, ...]

    @property
    def documents_per_s(self) -> float:
        """Documents a second, all servers together."""
        return sum(s.documents_per_s for s in self.servers)

    @property
    def tokens_per_s(self) -> float:
        """Tokens a second, all servers together."""
        return sum(s.tokens_per_s for s in self.servers)

    def to_json(self) -> dict[str, Any]:
        """The setting's result as the ``--json`` output writes it."""
        return {**self.setting.to_json(), "seconds": self.seconds, "requests": self.requests,
                "documents": self.documents, "tokens": self.tokens,
                "documents_per_s": round(self.documents_per_s, 1), "tokens_per_s": round(self.tokens_per_s, 1),
                "latency_ms": self.latency_ms, "errors": self.errors,
                "servers": [s.to_json() for s in self.servers]}


@dataclass(frozen=True)
class Answer:
    """One request of a slot (a worker that sends its next request when the last returns): its
    *cycle* began at ``start`` (the slot's previous answer, so client delays and error pauses count),
    it was sent at ``sent`` and answered at ``done``; ``kind`` is ``None``, an error's kind, or
    :data:`UNANSWERED` (still in flight when the drain ended: counted as ending then)."""

    start: float
    sent: float
    done: float
    documents: int
    tokens: int
    kind: str | None = None


def server_result(url: str, answers: list[Answer], window: tuple[float, float]) -> ServerResult:
    """One server's rates: each answer's work spread evenly over its cycle, the part inside the window.

    Counting whole answers inside a fixed window would catch or miss a whole server-side batch at
    each edge: at high concurrency, where answers come back a hundred at a time, that moves a result
    by ±10%; spreading removes it, and in a steady state both come to the same rate.
    """
    opens, closes = window
    documents = tokens = 0.0
    for a in answers:
        inside = min(a.done, closes) - max(a.start, opens)
        if inside > 0 and a.kind in (None, UNANSWERED):
            documents += a.documents * inside / (a.done - a.start)
            tokens += a.tokens * inside / (a.done - a.start)
    counted = [a for a in answers if opens <= a.done <= closes]
    latencies = [a.done - a.sent for a in counted if a.kind is None]
    errors = Counter(a.kind for a in counted if a.kind and a.kind != UNANSWERED)
    return ServerResult(url, documents / (closes - opens), tokens / (closes - opens),
                        percentiles(latencies)["p50"], dict(errors))


def percentiles(latencies: list[float]) -> dict[str, float | None]:
    """p50, p95 and p99 of ``latencies`` (seconds) in milliseconds to 0.1, ``None`` each for none."""
    if not latencies:
        return {"p50": None, "p95": None, "p99": None}
    p50, p95, p99 = np.percentile(np.asarray(latencies) * 1000, [50, 95, 99])
    return {"p50": round(float(p50), 1), "p95": round(float(p95), 1), "p99": round(float(p99), 1)}


def error_counts(parts: Sequence[ServerResult | SettingResult]) -> Counter[str]:
    """Errors by kind, summed over ``parts`` (the servers of a setting, or settings)."""
    return sum((Counter(part.errors) for part in parts), Counter())


def latency_text(value: float | None) -> str:
    """A latency in milliseconds as shown: ``"1,234 ms"``, or ``"–"`` for none."""
    return "–" if value is None else f"{value:,.0f} ms"


def error_text(errors: dict[str, int]) -> str:
    """``"429: 3, timeout: 1"``, or ``"-"`` for none."""
    return ", ".join(f"{kind}: {n}" for kind, n in sorted(errors.items())) or "-"
