"""One run per output: the lock is exclusive, names its holder, is taken over only from the dead."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import boto3
import orjson
import pytest

from teibatch.errors import EXIT_LOCKED, LockLost, OutputLocked
from teibatch.sink import LOCK, OutputLock, OutputStore

pytestmark = pytest.mark.timeout(60)


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OutputStore]:
    """An output on the local disk, or on moto's S3 server (conditional create via If-None-Match)."""
    if request.param == "local":
        yield OutputStore(str(tmp_path / "out"))
        return
    endpoint = request.getfixturevalue("s3_endpoint")
    boto3.client("s3", endpoint_url=endpoint).create_bucket(Bucket="vectors")
    yield OutputStore("s3://vectors/run", {"key": "testing", "secret": "testing",
                                            "client_kwargs": {"endpoint_url": endpoint, "region_name": "us-east-1"}})


def forge(store: OutputStore, *, host: str, pid: int, heartbeat_age_s: float) -> None:
    beat = (datetime.now(UTC) - timedelta(seconds=heartbeat_age_s)).isoformat()
    store.write_json(LOCK, {"run_id": "20260101-000000-dead", "host": host, "pid": pid,
                            "started_at": beat, "heartbeat_at": beat})


def dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    return int(done.stdout)


def test_a_second_run_is_refused_with_the_holder_named(store: OutputStore) -> None:
    first, second = OutputLock(store, "run-a"), OutputLock(store, "run-b")
    first.acquire()
    try:
        with pytest.raises(OutputLocked) as refused:
            second.acquire()
        assert refused.value.exit_code == EXIT_LOCKED == 4
        assert "run run-a" in str(refused.value) and socket.gethostname() in str(refused.value)
        first.check()  # the refused run changed nothing
    finally:
        first.release()
    assert first.holder() is None
    second.acquire()
    try:
        assert second.holder().run_id == "run-b"  # type: ignore[union-attr]
    finally:
        second.release()


@pytest.mark.parametrize(("host", "age", "taken"), [
    pytest.param("this", 0.0, True, id="same-host-process-gone"),
    pytest.param("elsewhere", 600.0, True, id="other-host-heartbeat-stale"),
    pytest.param("elsewhere", 5.0, False, id="other-host-heartbeat-fresh"),
])
def test_a_dead_run_s_lock_is_taken_over_and_a_live_one_is_not(store: OutputStore, host: str, age: float,
                                                               taken: bool) -> None:
    forge(store, host=socket.gethostname() if host == "this" else "builder-7", pid=dead_pid(), heartbeat_age_s=age)
    lock = OutputLock(store, "run-new")
    if not taken:
        with pytest.raises(OutputLocked, match="20260101-000000-dead"):
            lock.acquire()
        return
    lock.acquire()
    try:
        assert lock.took_over is not None and lock.took_over.run_id == "20260101-000000-dead"
        assert lock.holder().run_id == "run-new"  # type: ignore[union-attr]
    finally:
        lock.release()


def test_a_run_whose_lock_was_taken_over_stops_before_its_next_manifest_write(store: OutputStore) -> None:
    lock = OutputLock(store, "run-a")
    lock.acquire()
    try:
        forge(store, host="builder-7", pid=1, heartbeat_age_s=0)  # another run took it over
        with pytest.raises(LockLost, match="20260101-000000-dead"):
            lock.check()
    finally:
        lock.release()
    assert store.read_json(LOCK, fresh=True)["run_id"] == "20260101-000000-dead"  # not ours to remove


def test_the_heartbeat_moves_while_the_run_lives(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path / "out"))
    lock = OutputLock(store, "run-a", heartbeat=0.1)
    lock.acquire()
    try:
        first = lock.holder()
        deadline = datetime.now(UTC) + timedelta(seconds=10)
        while lock.holder() == first and datetime.now(UTC) < deadline:
            time.sleep(0.05)
        later = lock.holder()
        assert first is not None and later is not None and later.heartbeat_at > first.heartbeat_at
        assert later.started_at == first.started_at and later.run_id == "run-a"
    finally:
        lock.release()
    assert not (tmp_path / "out" / LOCK).exists()


def test_a_foreign_lock_file_is_named_not_trusted(tmp_path: Path) -> None:
    store = OutputStore(str(tmp_path / "out"))
    store.write_atomic(LOCK, lambda handle: handle.write(orjson.dumps({"who": "someone"})))
    with pytest.raises(Exception, match="is not a teibatch lock"):
        OutputLock(store, "run-a").acquire()
