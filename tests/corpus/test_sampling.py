"""A sample spread over the corpus: runs at evenly spaced places, read by the real readers."""

from __future__ import annotations

from pathlib import Path

from teibatch.corpus import CorpusOptions, Document, plan_shards, read_shard
from teibatch.corpus.sampling import estimate_total, spread_sample
from tests.conftest import write_jsonl


def test_runs_reach_every_file_and_the_end_of_each(tmp_path: Path) -> None:
    for name in "abc":
        write_jsonl(tmp_path / f"{name}.jsonl", [{"id": f"{name}{i}", "text": f"{name} {i}"} for i in range(300)])
    (tmp_path / "texts").mkdir()
    for i in range(60):
        (tmp_path / "texts" / f"t{i:02d}.txt").write_text(f"text file {i}")
    options = CorpusOptions(path=str(tmp_path), shard_docs=100)
    shards = plan_shards(options)
    runs = spread_sample(shards, 96, pieces=12)
    read = [[item.id for item in read_shard(options, run, verify=False) if isinstance(item, Document)]
            for run in runs]
    assert [len(ids) for ids in read] == [8] * 12
    ids = {i for run in read for i in run}
    assert len(ids) == 96  # no document twice
    for name in "abc":
        rows = sorted(int(i.partition("#")[2]) for i in ids if i.startswith(f"{name}.jsonl#"))
        assert rows and rows[0] < 100 and rows[-1] >= 200, (name, rows)  # its first third and its last
    assert any(i.startswith("texts/") for i in ids), ids  # a text shard's files, one document each
    assert spread_sample(shards, 10_000) == shards  # a small corpus is read whole


def test_estimate_range_from_the_runs_spread() -> None:
    whole = estimate_total([(10, 30), (10, 50)], 20)
    assert (whole.value, whole.low, whole.high) == (80, 80, 80)  # the whole corpus: exact
    even = estimate_total([(10, 40), (10, 40), (10, 40)], 300)
    assert (even.value, even.low, even.high) == (1200, 1200, 1200)  # no spread, no range
    spread = estimate_total([(10, 10), (10, 70), (10, 40)], 300)
    assert spread.low < spread.value == 1200 < spread.high
    assert spread.low >= 120  # never below what the sample made itself
