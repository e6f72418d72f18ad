"""A TEI-compatible embedding server (TEI 1.9.3's routes, limits and errors) that needs no GPU.

See ``docs/server.md``. Tests start one with :func:`running_server`; the CLI runs it with ``serve``.

The names below load on first use: ``teibatch run`` registers the ``serve`` command, and must not
pay for the web server's imports (aiohttp, numpy) on every start.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from teibatch.lazy import lazy_getattr

if TYPE_CHECKING:  # the same names, eagerly, for type checkers
    from teibatch.server.app import create_app
    from teibatch.server.backends.hashing import HashingEmbedder
    from teibatch.server.config import FaultConfig, ServerConfig
    from teibatch.server.metrics import text_digest
    from teibatch.server.runner import run_server, serve
    from teibatch.server.testing import running_server, server_stats
    from teibatch.server.tokens import ApproxTokenizer

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

__all__ = [
    "ApproxTokenizer",
    "FaultConfig",
    "HashingEmbedder",
    "ServerConfig",
    "create_app",
    "run_server",
    "running_server",
    "serve",
    "server_stats",
    "text_digest",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
