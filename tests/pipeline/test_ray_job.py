"""``ray job submit -- teibatch run job.yaml`` runs the job on the cluster and succeeds."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pyarrow.dataset as ds
import pytest
import yaml

from tests.conftest import write_jsonl
from tests.pipeline.conftest import free_port

pytestmark = pytest.mark.slow  # starts a Ray head and submits a Ray job

VENV_BIN = str(Path(sys.executable).parent)


@pytest.fixture
def ray_head_with_jobs() -> Iterator[tuple[str, dict[str, str]]]:
    """A ``ray start --head --block`` cluster with the job server on 127.0.0.1; stopped after."""
    if shutil.which("ray", path=VENV_BIN) is None:
        pytest.skip("the ray command (ray[default]) is not installed")
    dashboard = free_port()
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    temp_dir = tempfile.mkdtemp(prefix="rj-", dir="/tmp")  # short: Ray's unix sockets live here
    head = subprocess.Popen(
        [f"{VENV_BIN}/ray", "start", "--head", "--block", "--port=0", "--num-cpus=2", "--disable-usage-stats",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}",
         f"--dashboard-agent-listen-port={free_port()}", f"--ray-client-server-port={free_port()}",
         f"--temp-dir={temp_dir}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    address = f"http://127.0.0.1:{dashboard}"
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"{address}/api/version", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert head.poll() is None, "ray start exited"
            time.sleep(0.5)
        else:
            raise AssertionError("the Ray job server did not come up")
        yield address, env
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(head.pid, signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_ray_job_submit_runs_teibatch(tmp_path: Path, ray_head_with_jobs: tuple[str, dict[str, str]]) -> None:
    address, env = ray_head_with_jobs
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"id": str(i), "text": f"document {i}"} for i in range(30)])
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"corpus": {"path": str(tmp_path / "c"), "id_field": "id", "shard_docs": 10},
                                   "servers": {"provider": "local", "count": 1},
                                   "output": {"path": str(tmp_path / "out")}}))
    # The job server answers before the head's job agent has registered; until then Ray refuses a
    # submission with "No available agent ... try again later" (slow on a busy machine), so retry that alone.
    deadline = time.monotonic() + 120
    while True:
        submitted = subprocess.run([f"{VENV_BIN}/ray", "job", "submit", "--address", address, "--",
                                    "teibatch", "run", str(job)], env=env, capture_output=True, text=True,
                                   timeout=240, check=False)
        if "No available agent to submit job" not in submitted.stdout + submitted.stderr or time.monotonic() > deadline:
            break
        time.sleep(2)
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert "done: 30 documents embedded" in submitted.stdout
    assert ds.dataset(tmp_path / "out" / "vectors").count_rows() == 30
