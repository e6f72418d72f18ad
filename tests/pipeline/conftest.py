"""Fixtures for whole runs: real local servers, real Ray, job files written per test."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from teibatch.endpoint import Endpoint
from teibatch.fleet import LocalProvider


@pytest.fixture
def tei_servers() -> Iterator[Callable[..., list[Endpoint]]]:
    """Start built-in servers (``serve`` flags as arguments); all stop when the test ends."""
    providers: list[LocalProvider] = []

    def start(count: int = 1, *args: str) -> list[Endpoint]:
        provider = LocalProvider(count, server_args=list(args), startup_timeout=60)
        providers.append(provider)
        return provider.up()

    yield start
    for provider in providers:
        provider.down()


@pytest.fixture
def job_file(tmp_path: Path) -> Callable[..., Path]:
    """Write a job file from sections; returns its path."""

    def write(corpus: dict[str, Any], servers: dict[str, Any] | None = None, **sections: Any) -> Path:
        spec = {"name": "test-job", "corpus": corpus,
                "servers": servers or {"provider": "local", "count": 2},
                "output": {"path": str(tmp_path / "out")}, **sections}
        path = tmp_path / "job.yaml"
        path.write_text(yaml.safe_dump(spec))
        return path

    return write


@pytest.fixture
def two_node_cluster() -> Iterator[str]:
    """A Ray cluster of two nodes (one CPU each) on this machine; yields its address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(initialize_head=True, connect=False,
                      head_node_args={"num_cpus": 1, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes(timeout=60)
    try:
        yield cluster.address
    finally:
        cluster.shutdown()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def plain_env() -> dict[str, str]:
    """The environment of a user who set nothing about Ray (no address, no authentication mode)."""
    return {k: v for k, v in os.environ.items() if k not in ("RAY_ADDRESS", "RAY_AUTH_MODE", "RAY_AUTH_TOKEN")}


@pytest.fixture
def ambient_cluster(tmp_path: Path) -> Iterator[str]:
    """A `ray start --head` someone left running, with no CPU: a run that joined it could never finish."""
    port = free_port()
    ray_cli = Path(sys.executable).parent / "ray"
    env = {**plain_env(), "RAY_AUTH_MODE": "disabled"}
    process = subprocess.Popen([str(ray_cli), "start", "--head", "--block", f"--port={port}", "--num-cpus=0",
                                "--include-dashboard=false", "--disable-usage-stats"],
                               env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the ambient Ray cluster did not start")
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()  # --block: ray start stops what it started when it is terminated
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
