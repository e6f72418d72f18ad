"""The AIMD window: halve on 429 or latency growth, climb back (fast to where a 429 found it), within bounds."""

from __future__ import annotations

from teibatch.tei import ConcurrencyWindow
from teibatch.tei.window import WARMUP_SAMPLES


def steady(window: ConcurrencyWindow, requests: int, latency: float = 0.1, start: float = 0.0) -> float:
    """``requests`` full-batch answers at one latency; returns the clock after them."""
    now = start
    for _ in range(requests):
        now += latency
        window.on_success(window.step, latency, sent_at=now - latency, now=now)
    return now


def test_starts_at_the_share_and_never_goes_above_it() -> None:
    window = ConcurrencyWindow(64, 8)
    assert window.limit == 64
    steady(window, 100)
    assert window.limit == 64 and window.increases == 0


def test_429_halves_once_per_window_down_to_one_batch() -> None:
    window = ConcurrencyWindow(64, 8)
    window.on_overload(sent_at=1.0, now=2.0)
    assert window.limit == 32
    # More 429s from requests sent before the decrease are the same congestion event.
    window.on_overload(sent_at=1.5, now=2.1)
    window.on_overload(sent_at=2.0, now=2.2)
    assert window.limit == 32
    for i in range(10):
        window.on_overload(sent_at=3.0 + i, now=3.0 + i)
    assert window.limit == window.floor == 8
    assert window.decreases == 3


def test_after_a_429_climbs_back_within_a_window_to_where_it_was_then_one_batch_per_window() -> None:
    window = ConcurrencyWindow(64, 8)
    window.on_overload(sent_at=0.0, now=0.0)
    assert window.limit == 32
    now = steady(window, 3, start=1.0)  # one batch more per batch back: 40, 48, 56
    assert window.limit == 56
    now = steady(window, 1, start=now)
    assert window.limit == 64 and window.increases == 4
    # Still shared: another 429 halves it again, and it climbs back fast only to where that one found it.
    window.on_overload(sent_at=now, now=now + 0.1)
    window.on_overload(sent_at=now + 0.2, now=now + 0.3)
    assert window.limit == 16
    now = steady(window, 2, start=now + 1.0)
    assert window.limit == 32
    now = steady(window, 3, start=now)  # 24 inputs back: less than a window of 32
    assert window.limit == 32
    steady(window, 1, start=now)  # a whole window back without a signal: one batch more
    assert window.limit == 40


def test_latency_growth_halves_and_a_steady_slower_server_does_not_keep_halving() -> None:
    window = ConcurrencyWindow(64, 8)
    now = steady(window, 40, latency=0.1)
    assert window.limit == 64
    now = steady(window, 1, latency=1.0, start=now)
    assert window.limit == 32 and window.decreases == 1
    # A slower server climbs back one batch per clean window, not a 429's way.
    steady(window, 4, latency=1.0, start=now)
    assert window.limit == 40
    # The new latency is learned afresh: a server that stays slower is not starved.
    steady(window, 200, latency=1.0, start=now)
    assert window.decreases == 1
    assert window.limit == 64


def test_no_latency_judgement_during_warmup() -> None:
    window = ConcurrencyWindow(16, 8)
    now = steady(window, 1, latency=0.01)
    steady(window, WARMUP_SAMPLES - 2, latency=1.0, start=now)
    assert window.decreases == 0


def test_restart_after_being_down_is_at_half_the_share() -> None:
    window = ConcurrencyWindow(64, 8)
    window.restart()
    assert window.limit == 32
    tiny = ConcurrencyWindow(3, 8)
    assert (tiny.limit, tiny.step, tiny.floor) == (3, 3, 3)
    tiny.on_overload(sent_at=0, now=0)
    assert tiny.limit == 3
