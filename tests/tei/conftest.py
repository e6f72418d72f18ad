"""Fixtures for the TEI client's tests: built-in servers in threads, and one call to embed over them."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from teibatch.endpoint import Endpoint
from teibatch.server.testing import running_server, server_stats
from teibatch.tei import (
    ROUTE_EMBED,
    ClientLimits,
    EmbedOptions,
    EmbedResult,
    EndpointPool,
    RequestPacker,
    Server,
    TeiClient,
    embed_texts,
)

TINY = {"max_client_batch_size": 4, "payload_limit": 20_000, "max_concurrent_requests": 8}
"""The issue's tiny limits: 4 inputs a request, a 20 KB body, 8 inputs in flight."""
EMBED_DEADLINE_S = 60.0
"""No embed call in these tests may take longer than this (a hang is a failure, not a stuck suite)."""
ZERO_VIOLATIONS = {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerHandle:
    """A built-in server in a thread that a test can stop and start again on the same port."""

    options: dict[str, Any]
    port: int = field(default_factory=free_port)
    _stack: contextlib.ExitStack | None = None
    generations: list[dict[str, Any]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> ServerHandle:
        self._stack = contextlib.ExitStack()
        self._stack.enter_context(running_server(port=self.port, on_stopped=self.generations.append,
                                                 **self.options))
        return self

    def stop(self) -> None:
        """Stop answering: the listener closes (in-flight answers get a second), then refused.

        The server's final counts, every answer it gave included, go to ``generations``.
        """
        if self._stack is not None:
            self._stack.close()
            self._stack = None

    def stats(self) -> dict[str, Any]:
        """This server's counts summed over every start (``requests``: embedding requests only)."""
        current = [server_stats(self.url)] if self._stack is not None else []
        total: dict[str, Any] = {"texts": Counter(), "violations": Counter(), "inputs_embedded": 0,
                                 "max_inputs_per_request": 0, "max_body_bytes": 0, "max_inflight_inputs": 0,
                                 "faults": Counter(), "requests": 0}
        for s in self.generations + current:
            total["texts"].update(s.get("texts", {}))
            total["violations"].update(s["violations"])
            total["faults"].update(s["faults"])
            total["inputs_embedded"] += s["inputs_embedded"]
            routes = s["requests"]["by_route"]
            total["requests"] += routes.get("/embed", 0) + routes.get("/v1/embeddings", 0)
            for key in ("max_inputs_per_request", "max_body_bytes", "max_inflight_inputs"):
                total[key] = max(total[key], s[key])
        return total


@pytest.fixture
def tei() -> Iterator[Callable[..., ServerHandle]]:
    """Start built-in servers (``ServerConfig`` options); every one is stopped when the test ends."""
    handles: list[ServerHandle] = []

    def start(**options: Any) -> ServerHandle:
        handle = ServerHandle(options).start()
        handles.append(handle)
        return handle

    yield start
    for handle in handles:
        handle.stop()


def when(condition: Callable[[], bool], action: Callable[[], None], *, timeout: float = 30.0) -> threading.Thread:
    """Run ``action`` in a thread as soon as ``condition`` holds (polled; gives up after ``timeout``)."""

    def watch() -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                if condition():
                    action()
                    return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


@dataclass
class Embedded:
    result: EmbedResult
    stats: dict[str, dict[str, object]]
    seconds: float


def embed(urls: list[str], texts: list[str], *, key: str | None = None, options: EmbedOptions | None = None,
          route: str = ROUTE_EMBED, payload_limit: int = 20_000, max_retries: int = 6,
          timeout: float = 10.0, probe_interval: float = 0.1, down_grace: float = 10.0,
          api_key_env: str | None = None, latency_factor: float | None = None,
          limits: ClientLimits | None = None, transport: httpx.AsyncBaseTransport | None = None,
          beside: Callable[[EndpointPool, httpx.AsyncClient], Awaitable[None]] | None = None,
          all_sent: Callable[[], None] | None = None) -> Embedded:
    """``embed_texts`` over fresh clients of ``urls``, limits derived from each server's ``/info``
    (or ``limits``: then ``/info`` is not asked, as in a shard task). ``beside``: a coroutine run on the
    same event loop meanwhile, given the pool and the HTTP client (to change the pool as a sender would);
    ``all_sent``: passed to ``embed_texts``."""

    async def main() -> Embedded:
        async with httpx.AsyncClient(transport=transport) as http:
            servers = []
            for url in urls:
                client = TeiClient(Endpoint(url, key), http, timeout=timeout, api_key_env=api_key_env)
                derived = limits or ClientLimits.derive(await client.info(), payload_limit=payload_limit)
                extra = {} if latency_factor is None else {"latency_factor": latency_factor}
                servers.append(Server(client, derived, **extra))
            pool = EndpointPool(servers, probe_interval=probe_interval, down_grace=down_grace)
            packer = RequestPacker(route, options or EmbedOptions(), max_batch_size=pool.max_batch_size,
                                   payload_limit=pool.payload_limit)
            started = time.monotonic()
            side = asyncio.create_task(beside(pool, http)) if beside is not None else None
            try:
                result = await asyncio.wait_for(
                    embed_texts(pool, packer, texts, dimension=384, max_retries=max_retries, all_sent=all_sent),
                    EMBED_DEADLINE_S)
                if side is not None:
                    await asyncio.wait_for(side, EMBED_DEADLINE_S)
            finally:
                if side is not None and not side.done():
                    side.cancel()
                await pool.close()
            return Embedded(result, pool.stats(), time.monotonic() - started)

    return asyncio.run(main())


def corpus(n: int, *, seed: int = 0) -> list[str]:
    """``n`` distinct short texts (well under every limit), some with non-ASCII and JSON escapes."""
    return [f"doc {seed}-{i}: " + f"word{i % 13} " * (i % 17) + ("é\"\\\n" if i % 5 == 0 else "")
            for i in range(n)]
