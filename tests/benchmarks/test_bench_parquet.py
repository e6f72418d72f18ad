"""``benchmarks/bench_parquet.py`` runs on a few vectors and shows why the floor's parts cost less to write."""

from __future__ import annotations

import re

from tests.benchmarks.scripts import run_benchmark

ROW = re.compile(r"^\| (?P<dims>\d+) \| (?P<kind>[^|]+) \| (?P<compression>\w+) "
                 r"\| (?P<cpu>[\d.]+) \| (?P<size>[\d.]+) \|", re.M)


def test_repeated_vectors_compress_and_a_model_s_do_not() -> None:
    output = run_benchmark("bench_parquet.py", "--dims", "64", "--vectors", "4096", "--repeat", "1")
    sizes = {(m["kind"].split()[1], m["compression"]): float(m["size"]) for m in ROW.finditer(output)}
    assert set(sizes) == {("model's", "zstd"), ("model's", "none"), ("floor's", "zstd"), ("floor's", "none")}
    assert sizes["floor's", "zstd"] < 0.2 < 0.8 < sizes["model's", "zstd"]  # a model's floats barely compress
    assert all(float(m["cpu"]) > 0 for m in ROW.finditer(output))
