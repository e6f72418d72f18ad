"""Start a TEI-compatible server for a test and stop it after, on a free port chosen at run time.

Use it from any test (``tei/``, ``pipeline/``, ``fleet/`` ...)::

    from teibatch.server.testing import running_server, server_stats

    def test_client_respects_limits():
        with running_server(max_client_batch_size=8, record_texts=True) as url:
            ...  # point the client at url, e.g. "http://127.0.0.1:41234"
            stats = server_stats(url)
            assert stats["violations"] == {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}
            assert stats["inputs_embedded"] == 100

Options are :class:`~teibatch.server.config.ServerConfig` fields (``api_key="k"``,
``simulate_gpu=20000``, ``model_kind="reranker"`` ...), with faults as ``fault_rate_429=0.2`` or
``faults={"rate_429": 0.2}``. By default the server runs in a thread of the test process (starts
in milliseconds); ``subprocess=True`` runs ``python -m teibatch.server`` instead, for tests that
need a real process (SIGTERM, crash, ready file). Either way the context manager stops it on exit,
within a few seconds, even when the test fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess as sp
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import fields
from pathlib import Path
from typing import Any

import orjson

from teibatch.server.config import FaultConfig, ServerConfig, config_from_options
from teibatch.server.runner import serve

DEFAULT_STARTUP_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0


@contextlib.contextmanager
def running_server(config: ServerConfig | None = None, *, subprocess: bool = False,
                   startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
                   on_stopped: Callable[[dict[str, Any]], None] | None = None, **options: Any) -> Iterator[str]:
    """A running server for the block; yields its base URL (``http://127.0.0.1:PORT``, no trailing slash).

    ``on_stopped`` (thread servers only) gets the server's final stats, as :func:`server_stats` would
    read them, once it has stopped and every answer it was computing is given.
    """
    if config is None:
        config = config_from_options(**options)
    elif options:
        config = config.with_options(**options)
    if subprocess:
        if on_stopped is not None:
            raise ValueError("on_stopped needs the server in this process (subprocess=False)")
        with _subprocess_server(config, startup_timeout) as url:
            yield url
    else:
        with _thread_server(config, startup_timeout, on_stopped) as url:
            yield url


@contextlib.contextmanager
def _thread_server(config: ServerConfig, startup_timeout: float,
                   on_stopped: Callable[[dict[str, Any]], None] | None) -> Iterator[str]:
    ready = threading.Event()
    holder: dict[str, Any] = {}

    def main() -> None:
        loop = asyncio.new_event_loop()
        stop = asyncio.Event()
        holder["loop"], holder["stop"] = loop, stop

        def on_ready(url: str) -> None:
            holder["url"] = url
            ready.set()

        def stopped(body: dict[str, Any]) -> None:
            if on_stopped is not None:  # through JSON: the same types as from ``GET /teibatch/stats``
                on_stopped(orjson.loads(orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY)))

        try:
            loop.run_until_complete(serve(config, on_ready=on_ready, stop=stop, on_stopped=stopped))
        except BaseException as exc:  # reported to the test thread below
            holder["error"] = exc
        finally:
            ready.set()
            # As asyncio.run does: cancel what is left (a hung handler, say) before closing.
            pending = asyncio.all_tasks(loop)
            for task in pending:
                task.cancel()
            if pending:
                loop.run_until_complete(asyncio.wait(pending, timeout=STOP_TIMEOUT_S))
            loop.close()

    thread = threading.Thread(target=main, name="teibatch-test-server", daemon=True)
    thread.start()
    if not ready.wait(startup_timeout):
        raise TimeoutError(f"the test server did not start within {startup_timeout} s")
    if "error" in holder:
        raise RuntimeError("the test server failed to start") from holder["error"]
    try:
        yield holder["url"]
    finally:
        loop, stop = holder["loop"], holder["stop"]
        if not loop.is_closed():
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(stop.set)
        thread.join(STOP_TIMEOUT_S)


def cli_args(config: ServerConfig) -> list[str]:
    """``serve`` flags that reproduce ``config`` (used for the subprocess server)."""
    args: list[str] = []
    defaults = ServerConfig()
    for f in fields(ServerConfig):
        value = getattr(config, f.name)
        if f.name == "faults":
            for ff in fields(FaultConfig):
                fault_value = getattr(value, ff.name)
                if fault_value != getattr(defaults.faults, ff.name):
                    args += [f"--fault-{ff.name.replace('_', '-')}", str(fault_value)]
            continue
        if value == getattr(defaults, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "prompts":
            for name, text in value:
                args += ["--prompt", f"{name}={text}"]
        elif f.name == "record_texts":
            args.append(flag)
        elif isinstance(value, bool):
            args += [flag, "true" if value else "false"]
        else:
            args += [flag, str(value)]
    return args


@contextlib.contextmanager
def _subprocess_server(config: ServerConfig, startup_timeout: float) -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="teibatch-serve-") as tmp:
        ready_file = Path(tmp) / "ready.json"
        log = Path(tmp) / "server.log"
        command = [sys.executable, "-m", "teibatch.server", *cli_args(config),
                   "--ready-file", str(ready_file)]
        with open(log, "wb") as log_handle:
            process = sp.Popen(command, stdout=log_handle, stderr=sp.STDOUT, env={**os.environ})
        try:
            deadline = time.monotonic() + startup_timeout
            while not ready_file.exists():
                if process.poll() is not None:
                    raise RuntimeError(f"the test server exited with {process.returncode}: "
                                       f"{log.read_text(errors='replace')[-2000:]}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"the test server did not start within {startup_timeout} s")
                time.sleep(0.02)
            yield orjson.loads(ready_file.read_bytes())["url"]
        finally:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(STOP_TIMEOUT_S)
                except sp.TimeoutExpired:
                    process.kill()
                    process.wait(STOP_TIMEOUT_S)


def server_stats(url: str, *, reset: bool = False, timeout: float = 10.0) -> dict[str, Any]:
    """``GET /teibatch/stats`` of a running server (``reset=True``: ``DELETE``, which also zeroes them)."""
    import httpx  # only tests call this; the server itself does not need httpx

    method = "DELETE" if reset else "GET"
    response = httpx.request(method, f"{url}/teibatch/stats", timeout=timeout)
    response.raise_for_status()
    result: dict[str, Any] = response.json()
    return result
