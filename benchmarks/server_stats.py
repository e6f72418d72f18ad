"""What the benchmarks read from a built-in server's ``/teibatch/stats``: its busy share and its idle waits."""

from __future__ import annotations

from typing import Any


def busy_share(stats: dict[str, Any]) -> float:
    """Model-busy seconds over the span from the server's first batch to its last (0 before any batch)."""
    span = float(stats["serving_span_seconds"])
    return float(stats["model_busy_seconds"]) / span if span > 0 else 0.0


def idle_waits(stats: dict[str, Any], count: int = 3) -> str:
    """The server's ``count`` longest waits between batches, as ``0.21 s at 0.0 s`` (from its first batch)."""
    return ", ".join(f"{g['seconds']:.2f} s at {g['after_first_batch_s']:.1f} s"
                     for g in stats["longest_idle_gaps"][:count]) or "none"
