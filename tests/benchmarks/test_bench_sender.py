"""``benchmarks/bench_sender.py`` runs end to end on a few texts and prints both of its rows."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.scripts import run_benchmark

pytestmark = pytest.mark.slow  # starts canned servers and a private Ray in a process of its own

ROW = re.compile(r"^\| (?P<way>[^|]+) \| (?P<rate>[\d,]+) \| (?P<cpu>[\d.]+) \| (?P<caller>[\d.]+|–) \|", re.M)


def test_a_small_run_measures_the_sender_both_ways() -> None:
    output = run_benchmark("bench_sender.py", "--texts", "3000", "--repeats", "1", env={"RAY_AUTH_MODE": "disabled"})
    rows = {match["way"].strip(): match for match in ROW.finditer(output)}
    assert set(rows) == {"in-process (SenderCore)", "Ray actor, chunks from a task"}, output
    for match in rows.values():
        assert int(match["rate"].replace(",", "")) > 0
        assert float(match["cpu"]) > 0
    assert rows["in-process (SenderCore)"]["caller"] == "–"
    assert float(rows["Ray actor, chunks from a task"]["caller"]) > 0
