"""Counters the server keeps: TEI's Prometheus metrics, and teibatch's violation and fault counters.

``GET /metrics`` renders all of them in the Prometheus text format of metrics-exporter-prometheus
0.15.3 as TEI uses it: counters without a ``_total`` suffix (``te_request_count``), the gauge
``te_queue_size``, histograms in seconds with ``_bucket``/``_sum``/``_count``.

teibatch adds, for tests that assert a client behaved:

* ``teibatch_violation_total{kind="batch_size"|"payload"|"inflight"|"input_length"}``: requests
  that broke a limit (more inputs than ``max_client_batch_size``, a body over ``payload_limit``,
  inputs in flight over ``max_concurrent_requests``, an input over ``max_input_length`` with
  truncation off);
* ``teibatch_fault_injected{kind="429"|"503"|"424"|"500"|"drop"|"latency"|"hang"|"exit"}``;
* the same and more as JSON at ``GET /teibatch/stats`` (see :meth:`Metrics.stats`).

All updates happen on the event loop thread, so plain dicts and ints are enough.
"""

from __future__ import annotations

import bisect
import hashlib
import heapq
import math
import time
from collections import Counter
from collections.abc import Iterable
from typing import Any

VIOLATION_KINDS = ("batch_size", "payload", "inflight", "input_length")
FAULT_KINDS = ("429", "503", "424", "500", "drop", "latency", "hang", "exit")

_DURATION_BUCKETS = [1.5e-5 * 1.5**k for k in range(40)]
_LENGTH_BUCKETS = [float(2**k) for k in range(0, 21)]

Labels = tuple[tuple[str, str], ...]

IDLE_GAPS_KEPT = 5
"""How many of the longest idle waits between batches ``/teibatch/stats`` lists."""


def text_digest(item: str | tuple[int, ...] | list[int]) -> str:
    """The key ``/teibatch/stats`` records an input under (with ``--record-texts``).

    A text's is the BLAKE2b-128 hex digest of its UTF-8 bytes, as the client sent it (before
    prompt and truncation); token ids are digested as ``"ids:" + ",".join(ids)``.
    """
    data = item if isinstance(item, str) else "ids:" + ",".join(str(i) for i in item)
    return hashlib.blake2b(data.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


class _Histogram:
    def __init__(self, buckets: list[float]) -> None:
        self.buckets = buckets
        self.counts = [0] * len(buckets)
        self.sum = 0.0
        self.count = 0

    def observe(self, value: float) -> None:
        self.sum += value
        self.count += 1
        i = bisect.bisect_left(self.buckets, value)  # the first bucket whose bound is >= value
        if i < len(self.counts):
            self.counts[i] += 1


def _fmt(value: float) -> str:
    if isinstance(value, int) or (math.isfinite(value) and value == int(value) and abs(value) < 1e15):
        return str(int(value))
    return repr(float(value))


def _labels(labels: Labels, extra: tuple[str, str] | None = None) -> str:
    pairs = list(labels) + ([extra] if extra else [])
    if not pairs:
        return ""
    return "{" + ",".join(f'{k}="{v}"' for k, v in pairs) + "}"


class Metrics:
    """Every number the server reports; one instance per app."""

    def __init__(self, *, record_texts: bool = False) -> None:
        self.record_texts = record_texts
        self.reset()

    def reset(self) -> None:
        """Forget everything counted so far (``DELETE /teibatch/stats``), e.g. between tests."""
        self.counters: dict[str, dict[Labels, float]] = {}
        self.gauges: dict[str, float] = {"te_queue_size": 0}
        self.histograms: dict[str, dict[Labels, _Histogram]] = {}
        self.requests_by_route: Counter[str] = Counter()
        self.responses_by_status: Counter[str] = Counter()
        self.violations: Counter[str] = Counter({k: 0 for k in VIOLATION_KINDS})
        self.faults: Counter[str] = Counter({k: 0 for k in FAULT_KINDS})
        self.inputs_embedded = 0
        self.tokens_embedded = 0
        self.batches = 0
        self.max_inputs_per_request = 0
        self.max_body_bytes = 0
        self.max_inflight_inputs = 0
        self.busy_seconds = 0.0
        self.first_batch_started: float | None = None
        self.last_batch_finished: float | None = None
        # The longest waits between one batch's end and the next one's start, as (seconds, start of the
        # wait): where a client let the model sit idle.
        self.idle_gaps: list[tuple[float, float]] = []
        self.texts: Counter[str] = Counter()
        for kind in VIOLATION_KINDS:
            self.inc("teibatch_violation_total", kind=kind, by=0)
        for kind in FAULT_KINDS:
            self.inc("teibatch_fault_injected", kind=kind, by=0)

    def inc(self, name: str, by: float = 1, **labels: str) -> None:
        """Add ``by`` to a counter (created at 0 on first use)."""
        series = self.counters.setdefault(name, {})
        key = tuple(sorted(labels.items()))
        series[key] = series.get(key, 0) + by

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one value in a histogram: ``*_length``/``*_size``/``*_tokens`` count, others are seconds."""
        self._histogram(name, labels).observe(value)

    def observe_each(self, name: str, values: Iterable[float], **labels: str) -> None:
        """Record each of ``values`` in one histogram (a request's inputs: :meth:`observe` each)."""
        histogram = self._histogram(name, labels)
        for value in values:
            histogram.observe(value)

    def _histogram(self, name: str, labels: dict[str, str]) -> _Histogram:
        counting = name.endswith(("_length", "_size", "_tokens"))
        series = self.histograms.setdefault(name, {})
        key = tuple(sorted(labels.items()))
        if key not in series:
            series[key] = _Histogram(_LENGTH_BUCKETS if counting else _DURATION_BUCKETS)
        return series[key]

    def violation(self, kind: str) -> None:
        """Count one request that broke a limit (see the module docstring for the kinds)."""
        self.violations[kind] += 1
        self.inc("teibatch_violation_total", kind=kind)

    def fault(self, kind: str) -> None:
        """Count one injected fault."""
        self.faults[kind] += 1
        self.inc("teibatch_fault_injected", kind=kind)

    def model_busy(self, started: float, finished: float) -> None:
        """The model computed one batch from ``started`` to ``finished`` (``time.perf_counter`` seconds)."""
        self.busy_seconds += finished - started
        if self.first_batch_started is None:
            self.first_batch_started = started
        elif self.last_batch_finished is not None and started > self.last_batch_finished:
            gap = (started - self.last_batch_finished, self.last_batch_finished)
            if len(self.idle_gaps) < IDLE_GAPS_KEPT:
                heapq.heappush(self.idle_gaps, gap)
            elif gap > self.idle_gaps[0]:
                heapq.heapreplace(self.idle_gaps, gap)
        self.last_batch_finished = finished

    def embedded(self, items: list[Any], tokens: int) -> None:
        """Count inputs that were answered with vectors; digest them when recording."""
        self.inputs_embedded += len(items)
        self.tokens_embedded += tokens
        if self.record_texts:
            self.texts.update(text_digest(item) for item in items)

    def render(self) -> str:
        """The Prometheus text exposition of every counter, gauge and histogram."""
        lines: list[str] = []
        for name in sorted(self.counters):
            lines.append(f"# TYPE {name} counter")
            for labels, value in sorted(self.counters[name].items()):
                lines.append(f"{name}{_labels(labels)} {_fmt(value)}")
        for name in sorted(self.gauges):
            lines.append(f"# TYPE {name} gauge")
            lines.append(f"{name} {_fmt(self.gauges[name])}")
        for name in sorted(self.histograms):
            lines.append(f"# TYPE {name} histogram")
            for labels, hist in sorted(self.histograms[name].items()):
                cumulative = 0
                for bound, count in zip(hist.buckets, hist.counts, strict=True):
                    cumulative += count
                    lines.append(f"{name}_bucket{_labels(labels, ('le', repr(bound)))} {cumulative}")
                lines.append(f"{name}_bucket{_labels(labels, ('le', '+Inf'))} {hist.count}")
                lines.append(f"{name}_sum{_labels(labels)} {_fmt(hist.sum)}")
                lines.append(f"{name}_count{_labels(labels)} {hist.count}")
        return "\n".join(lines) + "\n"

    def stats(self, *, inflight_inputs: int, queue_size: int) -> dict[str, Any]:
        """The JSON of ``GET /teibatch/stats``: what clients sent, what broke a limit, what was injected."""
        result: dict[str, Any] = {
            "requests": {
                "total": sum(self.requests_by_route.values()),
                "by_route": dict(sorted(self.requests_by_route.items())),
                "by_status": dict(sorted(self.responses_by_status.items())),
            },
            "inputs_embedded": self.inputs_embedded,
            "tokens_embedded": self.tokens_embedded,
            "batches": self.batches,
            "queue_size": queue_size,
            "inflight_inputs": inflight_inputs,
            "max_inflight_inputs": self.max_inflight_inputs,
            "max_inputs_per_request": self.max_inputs_per_request,
            "max_body_bytes": self.max_body_bytes,
            "model_busy_seconds": round(self.busy_seconds, 6),
            "serving_span_seconds": round(self.last_batch_finished - self.first_batch_started, 6)
            if self.first_batch_started is not None and self.last_batch_finished is not None else 0.0,
            "longest_idle_gaps": [{"seconds": round(seconds, 6), "after_first_batch_s": round(at - first, 6)}
                                  for seconds, at in sorted(self.idle_gaps, reverse=True)]
            if (first := self.first_batch_started) is not None else [],
            "violations": dict(self.violations),
            "faults": dict(self.faults),
            # Every thread of the server's process, its start included: a benchmark that shares the
            # machine with its servers subtracts a reading taken before its client starts.
            "process_cpu_seconds": round(time.process_time(), 3),
        }
        if self.record_texts:
            result["texts"] = dict(sorted(self.texts.items()))
        return result
