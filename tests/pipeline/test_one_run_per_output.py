"""Two runs of one job on one output, started together: one works, the other is refused and touches nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import pytest
import ray
import yaml

from teibatch.errors import EXIT_LOCKED
from tests.conftest import write_jsonl


@pytest.fixture(scope="module")
def ray_address(ray_session: None) -> Iterator[str]:
    yield ray.get_runtime_context().gcs_address


@pytest.mark.timeout(300)
def test_an_overlapping_run_is_refused_with_its_own_exit_code_and_writes_nothing(tmp_path: Path,
                                                                                 ray_address: str) -> None:
    corpus = tmp_path / "corpus"
    for f in range(4):
        write_jsonl(corpus / f"f{f}.jsonl", [{"id": f"{f}-{i}", "text": f"text {i} of file {f}"} for i in range(30)])
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    # A slow simulated GPU keeps the first run going for seconds after it has taken the output.
    job.write_text(yaml.safe_dump({
        "name": "overlap", "corpus": {"path": str(corpus), "id_field": "id", "shard_docs": 10},
        "servers": {"provider": "local", "count": 1, "server_args": ["--simulate-gpu", "100"]},
        "output": {"path": str(out)}, "limits": {"max_shards_in_flight": 1}}))
    command = [sys.executable, "-m", "teibatch", "run", str(job), "-q", "--ray-address", ray_address]
    first = subprocess.Popen(command, env=dict(os.environ), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "_lock.json").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        holder = orjson.loads((out / "_lock.json").read_bytes())
        second = subprocess.run(command, env=dict(os.environ), capture_output=True, text=True, timeout=120,
                                check=False)
        assert first.poll() is None, "the first run was still going when the second was refused"
        _, first_err = first.communicate(timeout=240)
    finally:
        if first.poll() is None:
            first.kill()
    assert second.returncode == EXIT_LOCKED, second.stderr
    assert holder["run_id"] in second.stderr and "another teibatch run is writing" in second.stderr
    assert first.returncode == 0, first_err
    # The refused run left no report and no trace in the manifest; the output is one run's.
    reports = [orjson.loads(p.read_bytes()) for p in (out / "runs").iterdir()]
    assert [r["run_id"] for r in reports] == [holder["run_id"]]
    assert orjson.loads((out / "_manifest.json").read_bytes())["runs"] == [holder["run_id"]]
    ids = ds.dataset(out / "vectors").to_table(columns=["id"]).column("id").to_pylist()
    assert len(ids) == len(set(ids)) == 120
    assert not (out / "_lock.json").exists()
