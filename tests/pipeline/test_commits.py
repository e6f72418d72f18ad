"""Shards that finish while the manifest is being written are committed together, and none is lost."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import pytest

from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.sink import OutputStore
from teibatch.sink.manifest import Manifest
from tests.conftest import write_jsonl


@pytest.mark.usefixtures("ray_session")
def test_a_slow_manifest_write_commits_the_shards_finished_meanwhile_together(
        tmp_path: Path, job_file: Callable[..., Path], monkeypatch: pytest.MonkeyPatch) -> None:
    # Object storage, or a manifest of many thousand shards: each write takes a while. A write per
    # shard would cost the run one write per shard; finished shards wait for the next write instead.
    for number in range(4):
        write_jsonl(tmp_path / "corpus" / f"part-{number}.jsonl",
                    [{"id": f"f{number}-{i}", "text": f"document {number} {i}"} for i in range(30)])
    writes: list[int] = []
    save = Manifest.save

    def slow_save(manifest: Manifest, store: OutputStore) -> None:
        time.sleep(0.2)
        writes.append(len(manifest.shards))
        save(manifest, store)

    monkeypatch.setattr(Manifest, "save", slow_save)
    summary = run_job(load_job(job_file({"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 3},
                                        {"provider": "local", "count": 1})))
    assert summary.shards_committed == 40 and summary.shards_failed == 0
    manifest = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())
    assert len(manifest["shards"]) == 40
    ids = ds.dataset(tmp_path / "out" / "vectors").to_table(columns=["id"]).column("id").to_pylist()
    assert sorted(ids) == sorted(f"f{n}-{i}" for n in range(4) for i in range(30))
    committing = [count for count in writes if count > 0]
    assert committing[-1] == 40
    assert len(committing) < 20  # 40 shards, in far fewer writes
