"""``benchmarks/bench_parquet.py`` runs on a few vectors and shows why the floor's parts cost less to write."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_parquet.py"
ROW = re.compile(r"^\| (?P<dims>\d+) \| (?P<kind>[^|]+) \| (?P<compression>\w+) "
                 r"\| (?P<cpu>[\d.]+) \| (?P<size>[\d.]+) \|", re.M)


def test_repeated_vectors_compress_and_a_model_s_do_not() -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(SCRIPT), "--dims", "64", "--vectors", "4096", "--repeat", "1"],
                          capture_output=True, text=True, timeout=300, env=env, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    sizes = {(m["kind"].split()[1], m["compression"]): float(m["size"]) for m in ROW.finditer(done.stdout)}
    assert set(sizes) == {("model's", "zstd"), ("model's", "none"), ("floor's", "zstd"), ("floor's", "none")}
    assert sizes["floor's", "zstd"] < 0.2 < 0.8 < sizes["model's", "zstd"]  # a model's floats barely compress
    assert all(float(m["cpu"]) > 0 for m in ROW.finditer(done.stdout))
