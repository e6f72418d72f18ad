"""Meeting the servers before any shard runs: ``/info``, a probe request, and agreement checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from teibatch.endpoint import Endpoint
from teibatch.errors import JobSpecError, TeiAuthError, WrongModelKind
from teibatch.sparse import KIND_SPARSE
from teibatch.tei import (
    ROUTE_EMBED,
    ROUTE_EMBED_SPARSE,
    EmbedOptions,
    RequestPacker,
    ServerInfo,
    TeiClient,
    choose_route,
)


@dataclass(frozen=True)
class ConnectedServer:
    endpoint: Endpoint
    info: ServerInfo


@dataclass(frozen=True)
class ServersMet:
    """The servers as their ``/info`` shows them: one embedding model, one route; their vector size still unseen."""

    servers: tuple[ConnectedServer, ...]
    model_id: str
    route: str


@dataclass(frozen=True)
class Fleet(ServersMet):
    """The servers of one run, all serving the same model with the same vector size (for sparse
    vectors, the vocabulary size)."""

    dimension: int

    @property
    def sparse(self) -> bool:
        """Whether the run's vectors are sparse (the servers serve a SPLADE model, sent ``/embed_sparse``)."""
        return self.route == ROUTE_EMBED_SPARSE


def connect(endpoints: list[Endpoint], options: EmbedOptions, *, requested_route: str,
            expected_model: str | None, api_key_env: str | None, timeout: float,
            before_probe: Callable[[ServersMet], None] | None = None) -> Fleet:
    """Read every server's ``/info`` and send one probe with the job's options.

    The probe catches, before any shard runs, what would otherwise fail every request: a wrong
    key, a reranker instead of an embedding model, an unknown ``prompt_name``, bad ``dimensions``.
    For sparse vectors it also learns the vocabulary size, the length of the dense SPLADE vector that
    TEI's ``/embed`` answers with ``normalize: false`` (``/embed_sparse`` gives only the non-zero entries).
    ``before_probe`` is called between the two, with what ``/info`` said: a server is busy from its
    first embedding on, so the caller may first get ready to send the real ones (see
    ``pipeline/run.py``).
    """
    return asyncio.run(_connect(endpoints, options, requested_route, expected_model, api_key_env, timeout,
                                before_probe))


async def _connect(endpoints: list[Endpoint], options: EmbedOptions, requested_route: str,
                   expected_model: str | None, api_key_env: str | None, timeout: float,
                   before_probe: Callable[[ServersMet], None] | None) -> Fleet:
    from teibatch.tei import open_client  # aiohttp loads here, not when the driver's modules are imported

    async with open_client([e.url for e in endpoints]) as http:
        clients = [TeiClient(e, http, timeout=timeout) for e in endpoints]
        infos = await asyncio.gather(*(_read_info(client, api_key_env, options) for client in clients))
        met = _one_model(tuple(ConnectedServer(e, info) for e, info in zip(endpoints, infos, strict=True)),
                         options, requested_route, expected_model)
        if before_probe is not None:
            before_probe(met)
        dimensions = await asyncio.gather(*(_probe(client, met.route, options, api_key_env) for client in clients))
    if len(set(dimensions)) > 1:
        described = ", ".join(f"{s.endpoint.url} answers {dimension}-dimension vectors"
                              for s, dimension in zip(met.servers, dimensions, strict=True))
        raise JobSpecError(f"the servers disagree on the vector size: {described}; point the job at servers "
                           "that serve one model with the same `dimensions`", key="servers")
    return Fleet(servers=met.servers, model_id=met.model_id, dimension=dimensions[0], route=met.route)


def _one_model(servers: tuple[ConnectedServer, ...], options: EmbedOptions, requested_route: str,
               expected_model: str | None) -> ServersMet:
    """The servers' one model and one route, or a :class:`JobSpecError` naming what differs."""
    models = {s.info.model_id for s in servers}
    if len(models) > 1:
        described = ", ".join(f"{s.endpoint.url} serves {s.info.model_id}" for s in servers)
        raise JobSpecError(f"the servers disagree on the model: {described}; point the job at servers "
                           "that serve one model", key="servers")
    model_id = models.pop()
    if expected_model and expected_model != model_id:
        raise JobSpecError(f"the job asks for {expected_model} but the servers serve {model_id}; "
                           "fix model.id or the servers", key="model.id")
    # All servers share one route so that every vector comes from the same code path.
    routes = {choose_route(requested_route, options, s.info) for s in servers}
    if ROUTE_EMBED_SPARSE in routes and len(routes) > 1:
        described = ", ".join(f"{s.endpoint.url} pools with {s.info.pooling}" for s in servers)
        raise JobSpecError(f"the servers disagree on the kind of vectors: {described}; point the job at servers "
                           "that all serve a SPLADE model, or none", key="servers")
    return ServersMet(servers, model_id, routes.pop() if len(routes) == 1 else "embed")


async def _read_info(client: TeiClient, api_key_env: str | None, options: EmbedOptions) -> ServerInfo:
    with _naming_the_key(client, api_key_env):
        info = await client.info()
    if info.model_kind != "embedding":
        raise WrongModelKind(
            f"serves {info.model_id}, a {info.model_kind} model, not an embedding model; "
            "launch TEI with an embedding model for this job", server=client.url, status_code=None)
    if options.kind == KIND_SPARSE and info.pooling != "splade":
        raise WrongModelKind(
            f"serves {info.model_id} with {info.pooling} pooling, not a SPLADE model, so it gives no sparse "
            "vectors (model.kind: sparse); launch TEI with a SPLADE model, or set model.kind: dense",
            server=client.url, status_code=None)
    return info


async def _probe(client: TeiClient, route: str, options: EmbedOptions, api_key_env: str | None) -> int:
    """The size of the vectors ``client``'s server answers over ``route`` with the job's options
    (for sparse vectors, the vocabulary size: see :func:`connect`)."""
    packer = RequestPacker(route, options, max_batch_size=1, payload_limit=10**9)
    with _naming_the_key(client, api_key_env):
        vectors = await client.embed(packer.probe())
        if route != ROUTE_EMBED_SPARSE:
            return int(vectors.shape[1])
        dense = RequestPacker(ROUTE_EMBED, replace(options, normalize=False, dimensions=None),
                              max_batch_size=1, payload_limit=10**9)
        vocabulary = int((await client.embed(dense.probe())).shape[1])
    top = max((int(v.indices.max()) for v in vectors if len(v)), default=-1)
    if top >= vocabulary:
        raise JobSpecError(f"{client.url} answers sparse vectors with index {top}, beyond its own vocabulary of "
                           f"{vocabulary} terms; check the server's model", key="servers")
    return vocabulary


@contextmanager
def _naming_the_key(client: TeiClient, api_key_env: str | None) -> Iterator[None]:
    """A 401 says where the key comes from and what to do about it."""
    try:
        yield
    except TeiAuthError as exc:
        hint = (f"put the right key in the environment variable {api_key_env}" if api_key_env
                else "set servers.api_key_env to the name of an environment variable holding the key")
        raise TeiAuthError(f"the server refused the API key (401); {hint}", server=client.url,
                           status_code=exc.status_code) from None
