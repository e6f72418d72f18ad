"""What the benchmarks read from a built-in server's ``/teibatch/stats``: its busy share, its idle waits
and how full its batches were."""

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


def batch_fill(stats: dict[str, Any]) -> str:
    """Inputs per batch the server ran, on average, and the most inputs it held at once: a server busy all
    the time does less work than it could when its batches are small (each costs a fixed time too)."""
    batches = int(stats["batches"])
    mean = int(stats["inputs_embedded"]) / batches if batches else 0.0
    return (f"{mean:.0f} inputs a batch, at most {stats['max_inflight_inputs']} in flight, "
            f"{float(stats['serving_span_seconds']):.1f} s from first batch to last")
