"""SIGTERM, Ctrl-C and the runtime limit stop a run cleanly: report written, servers stopped, exit 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil
import pytest
import yaml

from tests.conftest import write_jsonl

pytestmark = pytest.mark.slow  # every test runs a `teibatch run` driver in a process of its own

SLOW_SERVER = ["--simulate-gpu", "3000", "--max-client-batch-size", "8"]


def slow_job(tmp_path: Path, **limits: object) -> Path:
    write_jsonl(tmp_path / "c" / "a.jsonl", [{"id": str(i), "text": f"document {i} " * 20} for i in range(3000)])
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(tmp_path / "c"), "id_field": "id", "shard_docs": 500},
        "servers": {"provider": "local", "count": 1, "server_args": SLOW_SERVER},
        "output": {"path": str(tmp_path / "out")}, "limits": {"max_shards_in_flight": 1, **limits}}))
    return job


def start(job: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "teibatch", "run", str(job)], env={**os.environ},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def command_line(process: psutil.Process) -> str:
    try:
        return " ".join(process.cmdline())
    except psutil.Error:  # gone meanwhile
        return ""


def servers_of(driver: subprocess.Popen[str], deadline_s: float = 120) -> list[psutil.Process]:
    """The driver's local server processes, once a shard task is running."""
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline and driver.poll() is None:
        children = psutil.Process(driver.pid).children(recursive=True)
        servers = [p for p in children if " serve " in command_line(p)]
        if servers and any("shard_task" in command_line(p) for p in children):
            return servers
        time.sleep(0.2)
    raise AssertionError("the run did not start its servers and a shard task in time")


@pytest.mark.parametrize("sig", [pytest.param(signal.SIGTERM, id="SIGTERM"),
                                 pytest.param(signal.SIGINT, id="SIGINT")])
def test_signal_stops_run_and_servers(tmp_path: Path, sig: signal.Signals) -> None:
    driver = start(slow_job(tmp_path))
    try:
        servers = servers_of(driver)
        time.sleep(1)
        driver.send_signal(sig)
        _, stderr = driver.communicate(timeout=60)
    finally:
        if driver.poll() is None:
            driver.kill()
    assert driver.returncode == 1, stderr
    assert "interrupted" in stderr
    _, alive = psutil.wait_procs(servers, timeout=10)
    assert alive == []
    report = orjson.loads(next((tmp_path / "out" / "runs").iterdir()).read_bytes())
    assert report["status"] == "interrupted"


def test_max_runtime_stops_the_run_resumably(tmp_path: Path) -> None:
    driver = start(slow_job(tmp_path, max_runtime="4s"))
    _, stderr = driver.communicate(timeout=120)
    assert driver.returncode == 1, stderr
    assert "max_runtime" in stderr
    report = orjson.loads(next((tmp_path / "out" / "runs").iterdir()).read_bytes())
    assert report["status"] == "incomplete"
    assert report["shards"]["committed"] < 6
