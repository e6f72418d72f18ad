"""A JSON HTTP server on 127.0.0.1 (a free port) for the fake cloud APIs; every request is recorded.

A fake subclasses :class:`FakeApi` and registers ``(method, path regex) → handler``; a handler gets the
match, the decoded body and the query, and returns ``(status, body)``. Requests without the expected
``Authorization: Bearer <key>`` get the fake's :meth:`~FakeApi.unauthorized` answer.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

Handler = Callable[[re.Match[str], Any, dict[str, list[str]]], tuple[int, Any]]


class FakeApi:
    """Serves the registered routes until :meth:`stop`; use as a context manager."""

    def __init__(self, api_key: str) -> None:
        self.api_key = api_key
        self.routes: list[tuple[str, re.Pattern[str], Handler]] = []
        self.requests: list[tuple[str, str, Any]] = []
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
                if self.headers.get("Authorization") != f"Bearer {fake.api_key}":
                    status, answer = fake.unauthorized()
                else:
                    status, answer = 404, {"error": "no such route"}
                    for verb, pattern, handler in fake.routes:
                        match = pattern.fullmatch(url.path)
                        if verb == method and match:
                            status, answer = handler(match, body, parse_qs(url.query))
                            break
                data = json.dumps(answer).encode()
                try:
                    self.send_response(status)
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
