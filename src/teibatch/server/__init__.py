"""A TEI-compatible embedding server (TEI 1.9.3's routes, limits and errors) that needs no GPU.

See ``docs/server.md``. Tests start one with :func:`running_server`; the CLI runs it with ``serve``.
"""

from __future__ import annotations

from teibatch.server.app import create_app
from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.config import FaultConfig, ServerConfig
from teibatch.server.metrics import text_digest
from teibatch.server.runner import run_server, serve
from teibatch.server.testing import running_server, server_stats
from teibatch.server.tokens import ApproxTokenizer

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
