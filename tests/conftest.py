"""Fixtures shared across the suite: a quiet environment, one Ray for the session, corpora."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

# Ray's token auth is for shared clusters; the tests' local Ray needs none.
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# Hermetic: a cluster someone started on this machine, or a RAY_ADDRESS in the environment, changes nothing.
os.environ.pop("RAY_ADDRESS", None)


@pytest.fixture(scope="session")
def ray_session() -> Iterator[None]:
    """One local Ray for every test that runs a job (starting Ray costs seconds), started as a run starts its own."""
    import ray

    from teibatch.pipeline.ray_runtime import start_local_ray

    start_local_ray(num_cpus=2)
    try:
        yield
    finally:
        ray.shutdown()


def write_jsonl(path: Path, rows: list[dict[str, object]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
    return path


def write_corpus(root: Path, files: dict[str, list[dict[str, str]]]) -> None:
    """Make ``root`` hold exactly ``files`` (name → rows) as JSON Lines: earlier ``.jsonl`` files go."""
    for old in root.glob("*.jsonl"):
        old.unlink()
    for name, rows in files.items():
        write_jsonl(root / name, rows)


@pytest.fixture
def small_corpus(tmp_path: Path) -> Path:
    """40 documents in two jsonl files, some texts repeated."""
    rows = [{"id": f"doc-{i:03d}", "text": f"document number {i % 30} about topic {i % 7}", "title": f"T{i}"}
            for i in range(40)]
    write_jsonl(tmp_path / "corpus" / "a.jsonl", rows[:25])
    write_jsonl(tmp_path / "corpus" / "b.jsonl", rows[25:])
    return tmp_path / "corpus"


@pytest.fixture
def s3_endpoint(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A real S3-compatible server (moto's) on 127.0.0.1 at a free port, fake credentials; stopped after."""
    server_module = pytest.importorskip("moto.server")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    server = server_module.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    try:
        yield endpoint
    finally:
        # moto keeps its buckets in the process, across servers: empty them for the next test.
        httpx.post(f"{endpoint}/moto-api/reset", timeout=10)
        server.stop()


# Fixtures that start Ray, a server or driver process, an sshd or a fake cloud: a test using one is `slow`.
# `pytest -m "not slow"` is the developers' quick loop; CI and the README's `pytest` run every test.
SLOW_FIXTURES = frozenset({"ray_session", "two_node_cluster", "tei_servers", "host", "fake_lambda", "fake_runpod",
                           "fake_vast", "s3_endpoint"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)
