"""``benchmarks/bench_sender.py`` runs end to end on a few texts and prints both of its rows."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # starts canned servers and a private Ray in a process of its own

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_sender.py"
ROW = re.compile(r"^\| (?P<way>[^|]+) \| (?P<rate>[\d,]+) \| (?P<cpu>[\d.]+) \| (?P<caller>[\d.]+|–) \|", re.M)


def test_a_small_run_measures_the_sender_both_ways() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "RAY_AUTH_MODE": "disabled"}
    done = subprocess.run([sys.executable, str(SCRIPT), "--texts", "3000", "--repeats", "1"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {match["way"].strip(): match for match in ROW.finditer(done.stdout)}
    assert set(rows) == {"in-process (SenderCore)", "Ray actor, chunks from a task"}, done.stdout
    for match in rows.values():
        assert int(match["rate"].replace(",", "")) > 0
        assert float(match["cpu"]) > 0
    assert rows["in-process (SenderCore)"]["caller"] == "–"
    assert float(rows["Ray actor, chunks from a task"]["caller"]) > 0
