"""The TEI client: limits from ``/info``, request packing, typed errors, retries, a pool of servers, and
the servers' ``/tokenize`` as a token counter.

``open_client`` loads on first use: it brings aiohttp (about 0.15 s of import), which a process that
imports the package without sending to a server (the chunker's, the driver's planning) does without.
"""

from typing import TYPE_CHECKING

from teibatch.lazy import lazy_getattr
from teibatch.tei.client import EmbedRequest, TeiClient, error_from_response, tls_context, tls_settings
from teibatch.tei.decode import ROUTE_EMBED, ROUTE_EMBED_SPARSE, ROUTE_OPENAI_BASE64, decode_sparse, decode_vectors
from teibatch.tei.embedder import EmbedResult, embed_texts
from teibatch.tei.info import ClientLimits, ServerInfo
from teibatch.tei.packing import (
    ON_TOO_LONG_REJECT,
    ON_TOO_LONG_TRUNCATE,
    ROUTE_AUTO,
    EmbedOptions,
    RequestPacker,
    choose_route,
)
from teibatch.tei.pool import EndpointPool, Server
from teibatch.tei.tokenize import RouteTokenCounter, TokenizeStats
from teibatch.tei.window import ConcurrencyWindow
from teibatch.tei.work import Failure

if TYPE_CHECKING:  # the same name, eagerly, for type checkers
    from teibatch.tei.transport import open_client

_EXPORTS = {"open_client": "teibatch.tei.transport"}

__all__ = [
    "ON_TOO_LONG_REJECT",
    "ON_TOO_LONG_TRUNCATE",
    "ROUTE_AUTO",
    "ROUTE_EMBED",
    "ROUTE_EMBED_SPARSE",
    "ROUTE_OPENAI_BASE64",
    "ClientLimits",
    "ConcurrencyWindow",
    "EmbedOptions",
    "EmbedRequest",
    "EmbedResult",
    "EndpointPool",
    "Failure",
    "RequestPacker",
    "RouteTokenCounter",
    "Server",
    "ServerInfo",
    "TeiClient",
    "TokenizeStats",
    "choose_route",
    "decode_sparse",
    "decode_vectors",
    "embed_texts",
    "error_from_response",
    "open_client",
    "tls_context",
    "tls_settings",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
