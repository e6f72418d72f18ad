"""Every warning a command prints is in teibatch's own format, beside its own lines (or JSON)."""

from __future__ import annotations

import logging
import re
import socket
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest
import yaml

from teibatch.logs import log_to_stderr
from teibatch.server.testing import running_server

STAMP = r"\d\d:\d\d:\d\d"
FOREIGN_FORMATS = re.compile(r"^(DEBUG|INFO|WARNING|ERROR|CRITICAL):|^\d{4}-\d\d-\d\d[ T].*(WARNING|ERROR)|"
                             r"Warning: ")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def teibatch(*args: str) -> subprocess.CompletedProcess[str]:
    """The command as a user runs it: its own process, so nothing of the test's logging set-up applies."""
    return subprocess.run([sys.executable, "-m", "teibatch", *args], capture_output=True, text=True, timeout=240,
                          check=False)


@pytest.fixture
def half_the_servers_down(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """A job on two static servers, the second not listening (a warning as the run starts); and that server's URL."""
    (tmp_path / "c.jsonl").write_text("".join(f'{{"text": "document {i}"}}\n' for i in range(5)))
    dead = f"http://127.0.0.1:{free_port()}"
    with running_server() as live:
        job = tmp_path / "job.yaml"
        job.write_text(yaml.safe_dump({"corpus": {"path": str(tmp_path / "c.jsonl")},
                                       "servers": {"provider": "static", "urls": [live, dead], "startup_timeout": 1},
                                       "output": {"path": str(tmp_path / "out")}}))
        yield job, dead


@pytest.mark.slow  # a `teibatch run` driver, with its Ray, in a process of its own
def test_a_warning_in_a_run_is_one_of_its_lines(half_the_servers_down: tuple[Path, str]) -> None:
    job, dead = half_the_servers_down
    done = teibatch("run", str(job))
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    warning = f"warning: {dead}: no answer on /health within 1s; going on without it"
    assert [line for line in lines if warning in line] == [line for line in lines if "warning" in line.lower()]
    assert sum(bool(re.fullmatch(f"{STAMP} {re.escape(warning)}", line)) for line in lines) == 1
    assert not [line for line in lines if FOREIGN_FORMATS.search(line)]
    assert all(re.match(STAMP + " ", line) for line in lines), "every line is the run's own"


@pytest.mark.slow  # a `teibatch run` driver, with its Ray, in a process of its own
def test_a_warning_in_a_json_log_is_json(half_the_servers_down: tuple[Path, str]) -> None:
    job, dead = half_the_servers_down
    done = teibatch("run", str(job), "--log-format", "json")
    assert done.returncode == 0, done.stderr
    events = [orjson.loads(line) for line in done.stderr.splitlines()]  # every line is JSON
    [warning] = [event for event in events if event["level"] == "warning"]
    assert warning["event"] == "log" and warning["logger"] == "teibatch.fleet.providers.static"
    assert warning["message"] == f"{dead}: no answer on /health within 1s; going on without it"
    assert warning["run_id"] == events[-1]["run_id"]


@pytest.fixture
def logging_restored() -> Iterator[None]:
    """Puts back the logging set-up a test changes (the root's handlers and level, Ray's logger, warnings)."""
    root, ray = logging.getLogger(), logging.getLogger("ray")
    saved = (root.handlers[:], root.level, ray.handlers[:], ray.propagate)
    try:
        yield
    finally:
        root.handlers[:], ray.handlers[:] = saved[0], saved[2]
        root.setLevel(saved[1])
        ray.propagate = saved[3]
        logging.captureWarnings(False)


@pytest.mark.usefixtures("logging_restored")
def test_library_loggers_and_python_warnings_take_the_same_format(capsys: pytest.CaptureFixture[str]) -> None:
    logging.getLogger().addHandler(logging.StreamHandler())  # as a library's logging.basicConfig() would
    ray = logging.getLogger("ray")
    ray.addHandler(logging.StreamHandler())  # as Ray's own handler does
    ray.propagate = False
    log_to_stderr()
    logging.getLogger("fsspec.local").warning("a library says %s", "this")
    ray.warning("Ray says this")
    logging.getLogger("teibatch.x").info("not shown: below warning")
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.warn("a deprecated thing", FutureWarning, stacklevel=1)
    lines = capsys.readouterr().err.splitlines()
    assert lines[:2] == ["warning: a library says this", "warning: Ray says this"]
    assert re.fullmatch(r"warning: .*test_logs\.py:\d+: FutureWarning: a deprecated thing", lines[2])
    assert len(lines) == 3
