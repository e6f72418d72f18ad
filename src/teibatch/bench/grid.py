"""The settings a bench measures: batch sizes × requests in flight, within the servers' limits.

A *setting* is a batch size (inputs a request) and a number of requests kept in flight on each
server; their product is the inputs in flight per server, the job's ``client.max_inflight_inputs``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

MIN_BATCH_SIZE = 8

T = TypeVar("T")


@dataclass(frozen=True, order=True)
class Setting:
    """``batch_size`` inputs a request, ``requests`` requests in flight on each server."""

    batch_size: int
    requests: int

    @property
    def inputs_in_flight(self) -> int:
        """Inputs in flight per server: what the job's ``client.max_inflight_inputs`` caps."""
        return self.batch_size * self.requests

    def label(self) -> str:
        """The setting in words, as progress lines, reasons and the chart show it."""
        return f"batch {self.batch_size} × {self.requests} in flight ({self.inputs_in_flight} inputs)"

    def to_json(self) -> dict[str, int]:
        """The setting as the ``--json`` output and the ``--save`` file write it."""
        return {"batch_size": self.batch_size, "requests_in_flight": self.requests,
                "inputs_in_flight": self.inputs_in_flight}


def plan_grid(max_batch_size: int, max_inflight_inputs: int, max_settings: int) -> list[Setting]:
    """The settings to measure, by batch size then concurrency; none over the limits, at most
    ``max_settings``.

    Batch sizes double from 8 up to ``max_batch_size`` (itself included); for each, requests in
    flight double from 1 while batch × requests fits ``max_inflight_inputs`` (the most that fits
    included). A larger grid keeps √``max_settings`` batch sizes and an even share of concurrencies
    each, both spread from smallest to largest: the ends (least latency, most throughput) are
    always measured.
    """
    top_batch = max(1, min(max_batch_size, max_inflight_inputs))
    batches = _doublings(min(MIN_BATCH_SIZE, top_batch), top_batch)
    lines = {b: _doublings(1, max_inflight_inputs // b) for b in batches}
    if sum(len(line) for line in lines.values()) > max_settings:
        batches = spread(batches, math.isqrt(max_settings))
        budget = max_settings
        for i, b in enumerate(batches):
            lines[b] = spread(lines[b], budget // (len(batches) - i))
            budget -= len(lines[b])
    return [Setting(b, r) for b in batches for r in lines[b]]


def _doublings(low: int, high: int) -> list[int]:
    values = []
    while low < high:
        values.append(low)
        low *= 2
    return [*values, high]


def spread(values: Sequence[T], k: int) -> list[T]:
    """``k`` of ``values`` evenly spaced by position: always the last, and the first when ``k`` > 1."""
    if k >= len(values):
        return list(values)
    if k == 1:
        return [values[-1]]
    step = (len(values) - 1) / (k - 1)  # > 1, so no two picks round to the same position
    return [values[int(i * step + 0.5)] for i in range(k)]
