"""A Ray cluster of several nodes on this machine runs the shards on more than one node."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import yaml

from tests.conftest import write_jsonl


def test_shards_run_on_several_nodes_into_one_output(tmp_path: Path, two_node_cluster: str) -> None:
    for f in range(4):
        write_jsonl(tmp_path / "c" / f"f{f}.jsonl", [{"id": f"{f}-{i}", "text": f"doc {i} in {f}"} for i in range(25)])
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(tmp_path / "c"), "id_field": "id", "shard_docs": 5},
        # Each batch takes 0.4 s: one node alone cannot finish the shards before the other's worker is up.
        "servers": {"provider": "local", "count": 2, "server_args": ["--simulate-gpu", "100000",
                                                                     "--batch-overhead-s", "0.4"]},
        "output": {"path": str(out)},
        "limits": {"max_shards_in_flight": 2}}))
    done = subprocess.run([sys.executable, "-m", "teibatch", "run", str(job), "-q", "--ray-address",
                           two_node_cluster], env=os.environ.copy(), capture_output=True, text=True, timeout=180,
                          check=False)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(next((out / "runs").iterdir()).read_bytes())
    assert len(report["shards_per_node"]) == 2, report["shards_per_node"]
    assert sum(report["shards_per_node"].values()) == 20
    ids = ds.dataset(out / "vectors").to_table().column("id").to_pylist()
    assert sorted(ids) == sorted(f"{f}-{i}" for f in range(4) for i in range(25))
