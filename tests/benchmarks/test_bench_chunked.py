"""``benchmarks/bench_chunked.py`` runs end to end on a few documents and prints what it promises."""

from __future__ import annotations

import re

import pytest

from tests.benchmarks.scripts import run_benchmark

pytestmark = pytest.mark.slow  # runs the benchmark script in a process of its own


def test_a_small_chunked_against_truncated_run() -> None:
    output = run_benchmark("bench_chunked.py", "--documents", "8", "--rate", "2000000", "--shard-docs", "4",
                           "--cpu-sample", "8")
    rows = {line.split()[0]: line.split() for line in output.splitlines()
            if line.startswith(("chunked ", "truncated "))}
    # run, documents, rows, inputs, embedded/corpus, busy mean, busy min, embed s, client CPU s, per 1M rows
    chunked, truncated = rows["chunked"], rows["truncated"]
    assert chunked[1] == truncated[1] == truncated[2] == "8"
    assert int(chunked[2].replace(",", "")) > 8 * 2_000 // 512  # every document in several chunks
    # All the text (the servers' count may hold a tail copy's inputs twice), against each document's first 512 tokens.
    assert float(chunked[4]) >= 1.0 and float(truncated[4]) < 0.5
    assert "1.000 of the corpus without special tokens or copies" in output
    assert all(0 < float(value) <= 1 for value in (*chunked[5:7], *truncated[5:7]))
    assert re.search(r"chunker, hashing rule \(the run's\), 8 documents: [\d,]+ tokens/s", output)
