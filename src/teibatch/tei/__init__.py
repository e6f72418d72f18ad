"""The TEI client: limits from ``/info``, request packing, typed errors, retries, a pool of servers, and
the servers' ``/tokenize`` as a token counter."""

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
    "tls_context",
    "tls_settings",
]
