"""The TEI client: limits from ``/info``, request packing, typed errors, retries, a pool of servers."""

from teibatch.tei.client import ROUTE_EMBED, ROUTE_OPENAI_BASE64, EmbedRequest, TeiClient
from teibatch.tei.embedder import EmbedResult, Failure, embed_texts
from teibatch.tei.info import ClientLimits, ServerInfo
from teibatch.tei.packing import ROUTE_AUTO, EmbedOptions, RequestPacker, choose_route
from teibatch.tei.pool import EndpointPool, Server

__all__ = [
    "ROUTE_AUTO",
    "ROUTE_EMBED",
    "ROUTE_OPENAI_BASE64",
    "ClientLimits",
    "EmbedOptions",
    "EmbedRequest",
    "EmbedResult",
    "EndpointPool",
    "Failure",
    "RequestPacker",
    "Server",
    "ServerInfo",
    "TeiClient",
    "choose_route",
    "embed_texts",
]
