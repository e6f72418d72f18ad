"""Progress lines: an ETA only once the rate is measured from real progress."""

from __future__ import annotations

import io

import pytest

from teibatch.pipeline.progress import ETA_MIN_SPAN_S, Eta, LineReporter


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_the_first_shard_start_up_never_makes_an_eta() -> None:
    # 7 shards of 100: the first finishes after 59 s of start-up, the other six within 3 s of it.
    clock, out = Clock(), io.StringIO()
    lines = LineReporter(out, interval=0, clock=clock)
    lines.start(7, 700)
    for at in (59.0, 59.5, 60.0, 60.5, 61.0, 61.5, 62.0):
        clock.now = at
        lines.advance(1, 100)
    shown = out.getvalue().splitlines()
    assert len(shown) == 8
    assert shown[1].endswith("shards 1/7, documents 100/700, 2 docs/s")
    assert not any("ETA" in line for line in shown)


def test_the_eta_comes_from_the_rate_after_the_first_shard() -> None:
    clock, out = Clock(), io.StringIO()
    lines = LineReporter(out, interval=0, clock=clock)
    lines.start(10, 1000)
    for at in (59.0, 60.0, 59.0 + ETA_MIN_SPAN_S, 69.0):
        clock.now = at
        lines.advance(1, 100)
    shown = [line.split(" ", 1)[1] for line in out.getvalue().splitlines()]
    assert shown[1:] == [
        "shards 1/10, documents 100/1,000, 2 docs/s",
        "shards 2/10, documents 200/1,000, 3 docs/s",               # 1 s of real progress: not yet
        "shards 3/10, documents 300/1,000, 5 docs/s, ETA 18s",      # 200 documents in 5 s, 700 left
        "shards 4/10, documents 400/1,000, 6 docs/s, ETA 20s",      # 300 in 10 s, 600 left
    ]


@pytest.mark.parametrize(("calls", "expected"), [
    pytest.param([(0, 10.0)], None, id="nothing-done"),
    pytest.param([(100, 10.0), (100, 30.0)], None, id="no-progress-since-the-first"),
    pytest.param([(100, 10.0), (1000, 30.0)], None, id="all-done"),
    pytest.param([(100, 10.0), (200, 12.0), (300, 20.0)], 35.0, id="measured"),
])
def test_eta_rule(calls: list[tuple[int, float]], expected: float | None) -> None:
    eta = Eta()
    left = [eta.seconds_left(done, 1000, now) for done, now in calls]
    assert left[-1] == expected
