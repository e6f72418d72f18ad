"""A JSON HTTP server on 127.0.0.1 (a free port) for the fake cloud APIs; every request is recorded.

A fake subclasses :class:`FakeApi` and registers ``(method, path regex) → handler``; a handler gets the
match, the decoded body and the query, and returns ``(status, body)``. Requests without the expected
``Authorization: Bearer <key>`` get the fake's :meth:`~FakeApi.unauthorized` answer. Rate limits as the
clouds document them: ``intervals`` (handler name, or ``*`` for every request → the least seconds between
two requests it accepts) and ``throttle`` (handler name → answer its next that many requests with 429
anyway); a request over a limit gets :meth:`~FakeApi.too_many_requests` with ``Retry-After`` and is
recorded in ``limited``. A container
cloud's fake (:class:`ContainerFake`) runs each container as TEI's router command line, with the
built-in server for the router, and records which program each container started with
(:attr:`ContainerFake.entrypoints`): the stand-in image's own entrypoint, or a replacement.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fleet.standin_docker import image_entrypoint

Handler = Callable[[re.Match[str], Any, dict[str, list[str]]], tuple[int, Any]]


class FakeApi:
    """Serves the registered routes until :meth:`stop`; use as a context manager."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.intervals: dict[str, float] = {}
        self.throttle: dict[str, int] = {}
        self.limited: list[tuple[str, str]] = []   # (method, path) of the requests answered 429
        self._last: dict[str, float] = {}
        self.lock = threading.RLock()
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                with fake.lock:
                    fake.requests.append((method, url.path, body))
                wait = None
                if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    status, answer = fake.unauthorized()
                else:
                    status, answer = 404, {"error": "no such route"}
                    for verb, pattern, handler in fake.routes:
                        match = pattern.fullmatch(url.path)
                        if verb == method and match:
                            wait = fake.over_limit(handler.__name__)
                            if wait is not None:
                                status, answer = fake.too_many_requests()
                                with fake.lock:
                                    fake.limited.append((method, url.path))
                            else:
                                status, answer = handler(match, body, parse_qs(url.query))
                            break
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    if wait is not None:
                        self.send_header("Retry-After", str(wait))
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (a create call that timed out)

            def do_GET(self) -> None:
                self._serve("GET")

            def do_POST(self) -> None:
                self._serve("POST")

            def do_PUT(self) -> None:
                self._serve("PUT")

            def do_DELETE(self) -> None:
                self._serve("DELETE")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, method: str, path: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(path), handler))

    def unauthorized(self) -> tuple[int, Any]:
        return 401, {"error": "unauthorized"}

    def too_many_requests(self) -> tuple[int, Any]:
        return 429, {"error": "too many requests"}

    def over_limit(self, route: str) -> int | None:
        """``None`` when a request to ``route`` is within the limits (it is then counted), else the whole
        seconds its ``Retry-After`` asks to wait."""
        with self.lock:
            if self.throttle.get(route, 0) > 0:
                self.throttle[route] -= 1
                return 1
            now = time.monotonic()
            waits = [self._last[key] + self.intervals[key] - now for key in (route, "*")
                     if key in self.intervals and key in self._last]
            if any(w > 0 for w in waits):
                return max(1, math.ceil(max(waits)))
            for key in (route, "*"):
                self._last[key] = now
            return None

    def start(self) -> FakeApi:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self._thread.join(timeout=10)

    def __enter__(self) -> FakeApi:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ContainerFake(FakeApi):
    """A fake whose containers are ``timeout <deadline> python -m teibatch serve --api-key <key> <router args>``
    processes on free 127.0.0.1 ports (``processes``, by instance id); all killed by :meth:`stop`."""

    def __init__(self, api_key: str, workdir: Path) -> None:
        super().__init__(api_key)
        self.workdir = workdir
        self.processes: dict[Any, subprocess.Popen[bytes]] = {}
        self.entrypoints: dict[str, str] = {}   # instance name → the program its container started with

    def bypassed(self) -> list[str]:
        """The instances whose container did not start with the image's own entrypoint (a CUDA image's)."""
        own = image_entrypoint("ghcr.io/huggingface/text-embeddings-inference:89-1.9")
        return sorted(name for name, program in self.entrypoints.items() if program != own)

    def run_router(self, instance_id: Any, name: str, command: list[str], api_key: str,
                   port: int | None = None) -> int:
        """Run TEI's ``timeout`` arguments ``[-k, <s>, <deadline>, <program>, <router args>]`` (on ``port``,
        else a free one), recording ``<program>`` (the image's ``/entrypoint.sh``, or a replacement such as
        ``text-embeddings-router``); the port it listens on."""
        assert command[0] == "-k" and len(command) > 3, command
        deadline, router_args = command[2], command[4:]
        self.entrypoints[name] = command[3]
        port = port or free_port()
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        serve = [sys.executable, "-m", "teibatch", "serve", "--hostname", "127.0.0.1", "--port", str(port),
                 "--api-key", api_key, *router_args]
        env = {k: v for k, v in os.environ.items() if k != "API_KEY"}
        self.processes[instance_id] = subprocess.Popen(["timeout", "-k", "5", deadline, *serve], stdout=log,
                                                       stderr=log, stdin=subprocess.DEVNULL, env=env,
                                                       start_new_session=True)
        return port

    def running(self) -> int:
        """Container processes still running."""
        return sum(1 for p in self.processes.values() if p.poll() is None)

    def kill(self, instance_id: Any) -> None:
        """What destroying an instance does to its container: it is gone."""
        process = self.processes.get(instance_id)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)

    def stop(self) -> None:
        for instance_id in list(self.processes):
            self.kill(instance_id)
        super().stop()
