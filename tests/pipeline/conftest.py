"""Fixtures for whole runs: real local servers, real Ray, job files written per test."""

from __future__ import annotations

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
