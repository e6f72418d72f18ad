"""A JSON HTTP server on 127.0.0.1 (a free port) for the fake cloud APIs; every request is recorded.

A fake subclasses :class:`FakeApi` and registers ``(method, path regex) → handler``; a handler gets the
match, the decoded body and the query, and returns ``(status, body)``. Requests without the expected
``Authorization: Bearer <key>`` get the fake's :meth:`~FakeApi.unauthorized` answer. A container
cloud's fake (:class:`ContainerFake`) runs each container as TEI's router command line, with the
built-in server for the router, and records which program each container started with
(:attr:`ContainerFake.entrypoints`): the stand-in image's own entrypoint, or a replacement.

A fake given a provider's spec (:class:`~tests.fleet.cloudspec.OpenApiSpec`, ``spec``) checks every
request against it before any handler runs, and refuses one that breaks it with :meth:`FakeApi.refuse`
(as the provider does); every answer it sends is checked against the spec too, and what is wrong is
kept in ``answer_problems`` (the fixtures assert it is empty; a 5xx or 401 where the operation documents
none is not checked).

Rate limits as the clouds document them, each answered with :meth:`FakeApi.too_many` and ``Retry-After``
and recorded in ``limited``: ``rate_limit`` (requests per ``rate_window_s``), ``intervals`` (handler name,
or ``*`` for every request → the least seconds between two requests it accepts) and ``forced_429``
(handler name → answer its next that many requests with 429 anyway). Tests set them to see the 429s;
by default there are none.

Faults for the orphan test (:class:`FaultSchedule`, ``faults``): a seeded schedule that answers requests,
by operation, late after acting (the client timed out, the cloud acted), late without acting (timed
out before the cloud acted), 429 bursts with ``Retry-After: 0``, or 503. Each fake keeps what its
instances cost: :meth:`FakeApi.billed_seconds` (from create until terminated).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import random
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Collection
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fleet.cloudspec import OpenApiSpec
from tests.fleet.standin_docker import image_entrypoint

#: a handler answers (status, body) or (status, body, headers)
Handler = Callable[[re.Match[str], Any, dict[str, list[str]]], tuple[Any, ...]]


#: the faults a :class:`FaultSchedule` injects, by the name it counts them under
FAULT_KINDS = ("late_answer", "timeout", "429", "5xx")


class FaultSchedule:
    """Seeded faults per request: each request to one of ``operations`` (handler names) gets a fault with
    probability ``rate``, its kind drawn from :data:`FAULT_KINDS`; a 429 starts a burst of up to
    ``max_burst`` 429s in a row on that operation. ``forced`` (handler name → kinds) is used first.
    ``delay_s`` is how late a ``late_answer`` or ``timeout`` answers: longer than the client's timeout."""

    def __init__(self, seed: int, *, rate: float, operations: Collection[str], delay_s: float,
                 max_burst: int = 3) -> None:
        self.random = random.Random(seed)
        self.rate = rate
        self.operations = set(operations)
        self.delay_s = delay_s
        self.max_burst = max_burst
        self.forced: dict[str, list[str]] = {}
        self.injected: Counter[str] = Counter()
        self._bursts: dict[str, int] = {}
        self._lock = threading.Lock()

    def draw(self, operation: str) -> str | None:
        """The fault for the next request to ``operation``, counted in ``injected`` (``None``: none)."""
        with self._lock:
            kind: str | None = None
            if self.forced.get(operation):
                kind = self.forced[operation].pop(0)
            elif self._bursts.get(operation, 0) > 0:
                self._bursts[operation] -= 1
                kind = "429"
            elif operation in self.operations and self.random.random() < self.rate:
                kind = self.random.choice(FAULT_KINDS)
                if kind == "429":
                    self._bursts[operation] = self.random.randint(0, self.max_burst - 1)
            if kind is not None:
                self.injected[kind] += 1
            return kind


class FakeApi:
    """Serves the registered routes until :meth:`stop`; use as a context manager."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self.requests: list[tuple[str, str, Any]] = []
        self.lock = threading.RLock()
        self.spec: OpenApiSpec | None = None
        self.refused: list[tuple[str, str, list[str]]] = []           # requests the spec check refused
        self.answers: list[tuple[str, str, int]] = []                 # every answer sent to a spec'd operation
        self.answer_problems: list[str] = []                          # answers that break the spec
        self.rate_limit: int | None = None
        self.rate_window_s = 60.0
        self.intervals: dict[str, float] = {}
        self.forced_429: dict[str, int] = {}
        self.limited: list[tuple[str, str]] = []   # (method, path) of the requests answered 429
        self._window: list[float] = []
        self._last: dict[str, float] = {}
        self.faults: FaultSchedule | None = None
        self.bills: dict[Any, tuple[str, float, float | None]] = {}   # instance id → (name, created, terminated)
        fake = self

        class _Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _serve(self, method: str) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                query = parse_qs(url.query)
                with fake.lock:
                    fake.requests.append((method, url.path, body))
                found = fake.spec.find(method, url.path) if fake.spec is not None else None
                headers: dict[str, str] = {}
                fault: str | None = None
                if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    status, answer = fake.unauthorized()
                elif fake.spec is not None and found is None:
                    status, answer = fake.refuse(404, [f"{method} {url.path}: no such operation in the spec"])
                elif (fault := fake.fault(method, url.path)) in ("429", "5xx", "timeout"):
                    if fault == "timeout":  # no answer in time, and nothing done: the client gives up first
                        time.sleep(fake.faults.delay_s if fake.faults else 0.0)
                    if fault == "429":
                        status, answer = fake.too_many(0)
                        headers["Retry-After"] = "0"
                        with fake.lock:
                            fake.limited.append((method, url.path))
                    else:
                        status, answer = fake.server_error()
                elif (retry_after := fake.throttle(method, url.path)) is not None:
                    status, answer = fake.too_many(retry_after)
                    headers["Retry-After"] = str(retry_after)
                    with fake.lock:
                        fake.limited.append((method, url.path))
                elif found is not None and (problems := fake.spec_problems(found, query, body)):
                    with fake.lock:
                        fake.refused.append((method, url.path, problems))
                    status, answer = fake.refuse(fake.refusal_status(problems), problems)
                else:
                    status, answer = 404, {"error": "no such route"}
                    for verb, pattern, handler in fake.routes:
                        match = pattern.fullmatch(url.path)
                        if verb == method and match:
                            status, answer, *extra = handler(match, body, query)
                            headers.update(*extra)
                            break
                if fault == "late_answer":  # done, but answered after the client gave up
                    time.sleep(fake.faults.delay_s if fake.faults else 0.0)
                content_type = fake.content_type(status)
                if found is not None:
                    fake.check_answer(found[0], status, answer, content_type)
                data = b"" if status == 204 else json.dumps(answer).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", content_type)
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
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

            def do_PATCH(self) -> None:
                self._serve("PATCH")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def route(self, method: str, path: str, handler: Handler) -> None:
        self.routes.append((method, re.compile(path), handler))

    def unauthorized(self) -> tuple[int, Any]:
        return 401, {"error": "unauthorized"}

    def spec_problems(self, found: tuple[Any, dict[str, str]], query: dict[str, list[str]], body: Any) -> list[str]:
        """What is wrong with a request by the spec (nothing without one)."""
        assert self.spec is not None
        operation, path_params = found
        return self.spec.request_problems(operation, path_params, query, body)

    def refusal_status(self, problems: list[str]) -> int:
        """The status of a request the spec check refused (the provider's: 400 unless a fake says otherwise)."""
        return 400

    def refuse(self, status: int, problems: list[str]) -> tuple[int, Any]:
        """The provider's answer to a request that breaks its spec; each fake gives its provider's shape."""
        return status, {"error": "; ".join(problems)}

    def too_many(self, retry_after: int) -> tuple[int, Any]:
        """The provider's 429 body (``Retry-After`` is added)."""
        return 429, {"error": "too many requests"}

    def server_error(self) -> tuple[int, Any]:
        """The provider's 503 body (an injected 5xx)."""
        return 503, {"error": "service unavailable"}

    def fault(self, method: str, path: str) -> str | None:
        """The injected fault for this request (:attr:`faults`), if any."""
        return self.faults.draw(self._handler_name(method, path)) if self.faults is not None else None

    def bill_start(self, instance_id: Any, name: str) -> None:
        """Instance ``name`` was made: it is billed from now."""
        with self.lock:
            self.bills[instance_id] = (name, time.monotonic(), None)

    def bill_stop(self, instance_id: Any) -> None:
        """An instance was terminated: its billing stops now (the first time)."""
        with self.lock:
            bill = self.bills.get(instance_id)
            if bill is not None and bill[2] is None:
                self.bills[instance_id] = (bill[0], bill[1], time.monotonic())

    def billed_seconds(self, prefix: str = "") -> float:
        """Seconds billed for the instances named ``prefix…``: from create until terminated, or until now."""
        now = time.monotonic()
        with self.lock:
            return sum((end if end is not None else now) - start for name, start, end in self.bills.values()
                       if name.startswith(prefix))

    def content_type(self, status: int) -> str:
        """The media type of an answer with ``status``."""
        return "application/json"

    @property
    def throttled(self) -> int:
        """How many requests were answered 429."""
        return len(self.limited)

    def throttle(self, method: str, path: str) -> int | None:
        """``Retry-After`` seconds when this request is over a limit (``rate_limit`` per ``rate_window_s``,
        its handler's ``intervals`` or ``forced_429``), else ``None`` (and the request is counted)."""
        route = self._handler_name(method, path)
        now = time.monotonic()
        with self.lock:
            if self.forced_429.get(route, 0) > 0:
                self.forced_429[route] -= 1
                return 1
            waits = [self._last[key] + self.intervals[key] - now for key in (route, "*")
                     if key in self.intervals and key in self._last]
            if any(w > 0 for w in waits):
                return max(1, math.ceil(max(waits)))
            if self.rate_limit is not None:
                self._window = [t for t in self._window if now - t < self.rate_window_s]
                if len(self._window) >= self.rate_limit:
                    return max(1, round(self.rate_window_s - (now - self._window[0])))
                self._window.append(now)
            for key in (route, "*"):
                self._last[key] = now
        return None

    def _handler_name(self, method: str, path: str) -> str:
        """The name of the handler that serves ``method path`` (``""`` when none does)."""
        for verb, pattern, handler in self.routes:
            if verb == method and pattern.fullmatch(path):
                return getattr(handler, "__name__", "")
        return ""

    def check_answer(self, operation: Any, status: int, answer: Any, content_type: str) -> None:
        """Keep what is wrong with an answer by the spec in ``answer_problems``."""
        assert self.spec is not None
        declared = operation.spec.get("responses", {})
        if (status >= 500 or status == 401) and not ({str(status), f"{status // 100}XX", "default"} & set(declared)):
            # a 5xx fault the test injects, or the 401 of the security scheme (a wrong key), on an operation
            # whose spec documents none: nothing to check it against
            return
        problems = self.spec.response_problems(operation, status, None if status == 204 else answer, content_type)
        with self.lock:
            self.answers.append((operation.method, operation.template, status))
            self.answer_problems += [f"{operation.name} {status}: {p}" for p in problems]

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


#: the program a CUDA image of TEI starts with when nothing replaces it
OWN_ENTRYPOINT = image_entrypoint("ghcr.io/huggingface/text-embeddings-inference:89-1.9")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class ContainerFake(FakeApi):
    """A fake whose containers are ``timeout <deadline> python -m teibatch serve --api-key <key> <router args>``
    processes on free 127.0.0.1 ports (``processes``, by instance id); all killed by :meth:`stop`. With
    ``containers`` off, an instance gets a port and no process (for tests of the renting machinery alone)."""

    def __init__(self, api_key: str, workdir: Path) -> None:
        super().__init__(api_key)
        self.workdir = workdir
        self.processes: dict[Any, subprocess.Popen[bytes]] = {}
        self.entrypoints: dict[str, str] = {}   # instance name → the program its container started with
        self.containers = True   # False: an instance's container runs no process (tests of renting alone)

    def bypassed(self) -> list[str]:
        """The instances whose container did not start with the image's own entrypoint (a CUDA image's)."""
        return sorted(name for name, program in self.entrypoints.items() if program != OWN_ENTRYPOINT)

    def run_router(self, instance_id: Any, name: str, command: list[str], api_key: str,
                   port: int | None = None) -> int:
        """Run TEI's ``timeout`` arguments ``[-k, <s>, <deadline>, <program>, <router args>]`` (on ``port``,
        else a free one), recording ``<program>`` (the image's ``/entrypoint.sh``, or a replacement such as
        ``text-embeddings-router``); the port it listens on."""
        assert command[0] == "-k" and len(command) > 3, command
        self.entrypoints[name] = command[3]
        deadline, router_args = command[2], command[4:]
        return self._serve(instance_id, name, ["timeout", "-k", "5", deadline], router_args, api_key, port)

    def run_entrypoint(self, instance_id: Any, name: str, args: list[str], api_key: str,
                       port: int | None = None) -> int:
        """Run the image as its own entrypoint runs it (TEI's ``entrypoint.sh`` → ``text-embeddings-router
        <args>``), with no deadline inside the container (the host holds it); the port it listens on."""
        self.entrypoints[name] = OWN_ENTRYPOINT
        return self._serve(instance_id, name, [], args, api_key, port)

    def _serve(self, instance_id: Any, name: str, wrapper: list[str], router_args: list[str], api_key: str,
               port: int | None) -> int:
        port = port or free_port()
        if not self.containers:
            return port
        log = open(self.workdir / f"{name}.log", "ab")  # noqa: SIM115 - handed to the child
        serve = [sys.executable, "-m", "teibatch", "serve", "--hostname", "127.0.0.1", "--port", str(port),
                 "--api-key", api_key, *router_args]
        env = {k: v for k, v in os.environ.items() if k != "API_KEY"}
        self.processes[instance_id] = subprocess.Popen([*wrapper, *serve], stdout=log, stderr=log,
                                                       stdin=subprocess.DEVNULL, env=env, start_new_session=True)
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
