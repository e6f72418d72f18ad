"""``benchmarks/bench_read.py`` runs on a small corpus and prints a row per codec."""

from __future__ import annotations

import re

from tests.benchmarks.scripts import run_benchmark

ROW = re.compile(r"^\| (?P<codec>\w+) \| (?P<plan>[\d.]+) \| (?P<one>[\d.]+) \| (?P<many>[\d.]+) "
                 r"\| (?P<ratio>[\d.]+) \|", re.M)


def test_every_codec_gets_its_row() -> None:
    output = run_benchmark("bench_read.py", "--docs", "3000", "--shard-docs", "500", "--repeat", "1")
    assert "3,000 documents in one file, 6 shards of 500" in output
    rows = {m["codec"]: m for m in ROW.finditer(output)}
    assert set(rows) == {"none", "gzip", "zstd"}
    assert all(float(row["one"]) > 0 and float(row["many"]) > 0 for row in rows.values())
