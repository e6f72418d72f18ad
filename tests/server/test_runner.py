"""Running the server as a process: ready file, SIGTERM, exit codes."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import orjson
import pytest

from teibatch.server.runner import EXIT_FAULT, base_url, write_ready_file


@pytest.mark.parametrize("host, url", [
    pytest.param("127.0.0.1", "http://127.0.0.1:8080", id="loopback"),
    pytest.param("0.0.0.0", "http://127.0.0.1:8080", id="wildcard"),
    pytest.param("::", "http://[::1]:8080", id="ipv6-wildcard"),
])
def test_base_url(host: str, url: str) -> None:
    assert base_url(host, 8080) == url


def test_ready_file_is_written_whole(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "ready.json"
    write_ready_file(target, "http://127.0.0.1:1")
    assert orjson.loads(target.read_bytes())["url"] == "http://127.0.0.1:1"
    assert [p.name for p in target.parent.iterdir()] == ["ready.json"]


def _start(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    ready = tmp_path / "ready.json"
    process = subprocess.Popen([sys.executable, "-m", "teibatch.server", "--port", "0", "--ready-file",
                                str(ready), *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 30
    while not ready.exists():
        assert process.poll() is None, "the server exited"
        assert time.monotonic() < deadline, "no ready file"
        time.sleep(0.02)
    return process, orjson.loads(ready.read_bytes())


def test_sigterm_stops_the_process_fast(tmp_path: Path) -> None:
    process, ready = _start(tmp_path)
    try:
        assert ready["pid"] == process.pid
        assert httpx.get(f"{ready['url']}/health").status_code == 200
        process.send_signal(signal.SIGTERM)
        started = time.monotonic()
        assert process.wait(10) == 0
        assert time.monotonic() - started < 3
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)


def test_exit_fault_ends_the_process_with_code_3(tmp_path: Path) -> None:
    process, ready = _start(tmp_path, "--fault-exit-after", "1")
    try:
        assert httpx.post(f"{ready['url']}/embed", json={"inputs": "a"}).status_code == 200
        assert process.wait(10) == EXIT_FAULT
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
