"""Running the server: bind, announce readiness, serve until told to stop, stop fast.

Like TEI, the socket is bound only after the backend is loaded, so "connection refused" means "not
ready yet". Once listening, the base URL is announced: through ``on_ready`` (in-process callers)
and/or a ready file written atomically (``{"url": ..., "pid": ...}``, temp file then rename), which
is how the ``local`` provider learns the port of ``--port 0``. SIGTERM and SIGINT stop the server
within about a second: the listener closes, in-flight answers get ``SHUTDOWN_TIMEOUT_S`` to finish.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from teibatch.server.app import create_app
from teibatch.server.backends import load_backend
from teibatch.server.config import ServerConfig
from teibatch.server.faults import FAULTS
from teibatch.server.state import STATE

SHUTDOWN_TIMEOUT_S = 1.0
EXIT_FAULT = 3
"""Exit code of ``serve`` when the ``exit_after`` fault stopped it."""


def base_url(host: str, port: int) -> str:
    """The URL clients use: a wildcard bind is announced as loopback."""
    if host in ("0.0.0.0", ""):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"http://{host}:{port}"


def write_ready_file(path: str | os.PathLike[str], url: str) -> None:
    """Write ``{"url", "pid"}`` to ``path`` atomically, so a reader never sees half a file."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(orjson.dumps({"url": url, "pid": os.getpid()}))
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


async def serve(config: ServerConfig, *, ready_file: str | os.PathLike[str] | None = None,
                on_ready: Callable[[str], None] | None = None,
                stop: asyncio.Event | None = None,
                on_stopped: Callable[[dict[str, Any]], None] | None = None) -> int:
    """Serve ``config`` until ``stop`` is set (or SIGTERM/SIGINT in the main thread); the exit code.

    Returns 0 after a requested stop and :data:`EXIT_FAULT` after the ``exit_after`` fault.
    ``on_stopped`` gets the final ``/teibatch/stats`` body once every in-flight answer is given.
    """
    stop = stop if stop is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    backend = await asyncio.to_thread(load_backend, config) if config.backend != "hashing" \
        else load_backend(config)
    app = create_app(config, backend)
    faulted = False

    def fault_stop() -> None:
        nonlocal faulted
        faulted = True
        stop.set()

    app[FAULTS].request_stop = fault_stop
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT_S, handle_signals=False)
    await runner.setup()
    installed: list[int] = []
    try:
        site = web.TCPSite(runner, config.hostname, config.port, reuse_address=True)
        await site.start()
        port = runner.addresses[0][1]
        url = base_url(config.hostname, port)
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                try:
                    loop.add_signal_handler(sig, stop.set)
                    installed.append(sig)
                except (NotImplementedError, RuntimeError):  # pragma: no cover - not on this platform
                    pass
        if ready_file is not None:
            write_ready_file(ready_file, url)
        if on_ready is not None:
            on_ready(url)
        await stop.wait()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)
        await runner.cleanup()
        if on_stopped is not None:
            on_stopped(app[STATE].stats())
    return EXIT_FAULT if faulted else 0


def run_server(config: ServerConfig, *, ready_file: str | os.PathLike[str] | None = None) -> int:
    """Serve ``config`` in this process until SIGTERM/SIGINT; blocks; returns the exit code."""
    print(f"teibatch serve: {config.model_id} ({config.backend}) on {config.hostname}:{config.port}",
          file=sys.stderr, flush=True)
    return asyncio.run(serve(config, ready_file=ready_file,
                             on_ready=lambda url: print(f"teibatch serve: ready at {url}", file=sys.stderr,
                                                        flush=True)))
