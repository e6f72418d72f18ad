"""Adaptive concurrency for one server: how many inputs this client keeps in flight there (AIMD).

The window starts at the server's whole in-flight budget (``ceiling``: ``max_concurrent_requests``,
or the job's lower override), which the one sender that owns the server for the run uses alone
(``pipeline/senders/``); it moves only below that:

* **halve** on a 429 (someone else uses the server too, or it lies about its limit), and when
  latency grows: the recent latency (a fast moving average) passes ``latency_factor`` times the
  long-run latency (a slow one that follows gradual change but not jumps), i.e. the server got
  slower for the same load; the latency is then learned afresh at the new window;
* **add one batch** each time a whole window of inputs came back without either signal, up to the
  ceiling, so the server is kept busy again once it keeps up — and, after a 429, one batch per
  batch of inputs back (the window doubles per window) until it is where the 429 found it: TEI
  refuses at once and processes nothing, so a 429 says the server was full at that moment, not that
  it is slower; while it stays shared the 429s keep coming and hold the window down, and once the
  other client is gone the server is full again within a window instead of after many (at 512
  inputs and 32 a batch, halving and climbing back one batch per window took 8 windows, with the
  server short of work meanwhile);
* never under ``floor`` (one batch), so a server is never starved to zero.

One decrease per congestion event: a signal from a request sent before the last decrease is
ignored, so a burst of 429s from one window halves it once, not ten times.
"""

from __future__ import annotations

import math

DEFAULT_LATENCY_FACTOR = 3.0
FAST_WEIGHT = 0.3
SLOW_WEIGHT = 0.02
SLOW_STEP = 1.5
WARMUP_SAMPLES = 8


class ConcurrencyWindow:
    """AIMD limit on one client's inputs in flight to one server, in ``[floor, ceiling]``."""

    def __init__(self, ceiling: int, step: int, *, latency_factor: float = DEFAULT_LATENCY_FACTOR) -> None:
        self.ceiling = max(1, ceiling)
        self.step = max(1, min(step, self.ceiling))
        self.floor = self.step
        self.latency_factor = latency_factor
        self.limit = self.ceiling
        self.decreases = 0
        self.increases = 0
        self._acked = 0
        self._effective_from = -math.inf
        self._recover_to = 0  # below this, after a 429, the window climbs back one batch per batch acked
        self._fast: float | None = None
        self._slow: float | None = None
        self._samples = 0

    def __repr__(self) -> str:
        return f"ConcurrencyWindow(limit={self.limit}, floor={self.floor}, ceiling={self.ceiling})"

    def on_success(self, inputs: int, latency: float, *, sent_at: float, now: float) -> None:
        """A request of ``inputs`` sent at ``sent_at`` answered after ``latency`` seconds."""
        self._observe(latency)
        if self._latency_grew() and sent_at > self._effective_from:
            self._decrease(now)
            # Learn the latency afresh at the new window (requests still queued drain meanwhile).
            self._forget()
            return
        self._acked += inputs
        climb = self.step if self.limit < self._recover_to else self.limit
        if self._acked >= climb and self.limit < self.ceiling:
            self.limit = min(self.ceiling, self.limit + self.step)
            self.increases += 1
            self._acked = 0

    def on_overload(self, *, sent_at: float, now: float) -> None:
        """A request sent at ``sent_at`` got 429: nothing was processed, the server is full."""
        if sent_at > self._effective_from:
            self._decrease(now, recover_to=self.limit)

    def restart(self) -> None:
        """The server came back after being down: start again at half the ceiling."""
        self.limit = max(self.floor, self.ceiling // 2)
        self._acked = 0
        self._recover_to = 0
        self._forget()

    def _forget(self) -> None:
        self._fast = self._slow = None
        self._samples = 0

    def _decrease(self, effective_from: float, recover_to: int = 0) -> None:
        """Halve the window; below ``recover_to`` (a 429's, see :meth:`on_overload`) it climbs back fast."""
        self._recover_to = recover_to
        smaller = max(self.floor, self.limit // 2)
        self.decreases += smaller < self.limit
        self.limit = smaller
        self._acked = 0
        self._effective_from = effective_from

    def _observe(self, latency: float) -> None:
        # A plain mean over the warm-up, then moving averages. The slow one takes each sample at most
        # SLOW_STEP times its value, so a sudden jump shows against the level before it instead of
        # dragging the baseline up with it; a gradual rise is followed.
        self._samples += 1
        if self._fast is None or self._slow is None:
            self._fast = self._slow = latency
            return
        self._fast += max(FAST_WEIGHT, 1 / self._samples) * (latency - self._fast)
        if self._samples <= self._warmup:
            self._slow += (latency - self._slow) / self._samples
        else:
            self._slow += SLOW_WEIGHT * (min(latency, SLOW_STEP * self._slow) - self._slow)

    @property
    def _warmup(self) -> int:
        # Two full windows of requests: at the start the server's queue is still filling up.
        return max(WARMUP_SAMPLES, 2 * self.ceiling // self.step)

    def _latency_grew(self) -> bool:
        if self._samples <= self._warmup or self._fast is None or self._slow is None:
            return False
        return self._fast > self.latency_factor * self._slow
