"""``benchmarks/bench_cpu.py`` runs end to end on a few documents and its figures are sane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # runs the benchmark script, Ray and servers included, in a process of its own

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_cpu.py"


def test_a_small_run_measures_every_client(tmp_path: Path) -> None:
    report = tmp_path / "rows.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--docs", "2000", "--dims", "384", "--json", str(report)],
                          capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "floor not given" in done.stdout
    rows = {row["contestant"]: row for row in json.loads(report.read_text())}
    assert set(rows) == {"teibatch", "loop"}
    for row in rows.values():
        assert row["rows"] == row["docs"] == 2000 and row["dims"] == 384
        assert row["wall_s"] > 0 and row["docs_per_s"] > 0
        assert row["cpu_s"] > 0 and row["cpu_per_million"] == pytest.approx(row["cpu_s"] / 2000 * 1e6)
        assert row["ratio_to_floor"] is None
        assert 0 < row["busy_min"] <= row["busy_mean"] <= 1
        assert len(row["idle_waits"]) == 2 and all(w.startswith("http://127.0.0.1:") for w in row["idle_waits"])
    # teibatch's Ray workers sit under the raylet, whose accounting is lost: their CPU comes from sampling.
    assert 0 < rows["teibatch"]["sampled_cpu_s"] < rows["teibatch"]["cpu_s"]
    assert "| teibatch | 2,000 | 384 |" in done.stdout and "| loop | 2,000 | 384 |" in done.stdout
