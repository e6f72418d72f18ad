"""A TEI-compatible embedding server (TEI 1.9.3's routes, limits and errors) that needs no GPU.

See ``docs/server.md``. Tests start one with :func:`running_server`; the CLI runs it with ``serve``.

The names below load on first use: ``teibatch run`` registers the ``serve`` command, and must not
pay for the web server's imports (aiohttp, numpy) on every start.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "ApproxTokenizer": "teibatch.server.tokens",
    "FaultConfig": "teibatch.server.config",
    "HashingEmbedder": "teibatch.server.backends.hashing",
    "ServerConfig": "teibatch.server.config",
    "create_app": "teibatch.server.app",
    "run_server": "teibatch.server.runner",
    "running_server": "teibatch.server.testing",
    "serve": "teibatch.server.runner",
    "server_stats": "teibatch.server.testing",
    "text_digest": "teibatch.server.metrics",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'teibatch.server' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
