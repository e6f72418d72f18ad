"""``benchmarks/bench_read.py`` runs on a small corpus and prints a row per codec."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_read.py"
ROW = re.compile(r"^\| (?P<codec>\w+) \| (?P<plan>[\d.]+) \| (?P<one>[\d.]+) \| (?P<many>[\d.]+) "
                 r"\| (?P<ratio>[\d.]+) \|", re.M)


def test_every_codec_gets_its_row() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--docs", "3000", "--shard-docs", "500", "--repeat", "1"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "3,000 documents in one file, 6 shards of 500" in done.stdout
    rows = {m["codec"]: m for m in ROW.finditer(done.stdout)}
    assert set(rows) == {"none", "gzip", "zstd"}
    assert all(float(row["one"]) > 0 and float(row["many"]) > 0 for row in rows.values())
