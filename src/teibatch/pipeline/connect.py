"""Meeting the servers before any shard runs: ``/info``, a probe request, and agreement checks."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

from teibatch.endpoint import Endpoint
from teibatch.errors import JobSpecError, TeiAuthError, WrongModelKind
from teibatch.tei import EmbedOptions, RequestPacker, ServerInfo, TeiClient, choose_route


@dataclass(frozen=True)
class ConnectedServer:
    endpoint: Endpoint
    info: ServerInfo


@dataclass(frozen=True)
class Fleet:
    """The servers of one run, all serving the same model with the same vector size."""

    servers: tuple[ConnectedServer, ...]
    model_id: str
    dimension: int
    route: str


def connect(endpoints: list[Endpoint], options: EmbedOptions, *, requested_route: str,
            expected_model: str | None, api_key_env: str | None, timeout: float = 30.0,
            before_probe: Callable[[], None] | None = None) -> Fleet:
    """Read every server's ``/info`` and send one probe with the job's options.

    The probe catches, before any shard runs, what would otherwise fail every request: a wrong
    key, a reranker instead of an embedding model, an unknown ``prompt_name``, bad ``dimensions``.
    ``before_probe`` is called between the two: a server is busy from its first embedding on, so
    the caller may first get ready to send the real ones (see ``pipeline/run.py``).
    """
    return asyncio.run(_connect(endpoints, options, requested_route, expected_model, api_key_env, timeout,
                                before_probe))


async def _connect(endpoints: list[Endpoint], options: EmbedOptions, requested_route: str,
                   expected_model: str | None, api_key_env: str | None, timeout: float,
                   before_probe: Callable[[], None] | None) -> Fleet:
    async with httpx.AsyncClient() as http:
        clients = [TeiClient(e, http, timeout=timeout) for e in endpoints]
        infos = await asyncio.gather(*(_read_info(client, api_key_env) for client in clients))
        if before_probe is not None:
            before_probe()
        results = await asyncio.gather(*(_probe(client, info, options, requested_route, api_key_env)
                                         for client, info in zip(clients, infos, strict=True)))
    servers = tuple(ConnectedServer(e, info) for e, (info, _, _) in zip(endpoints, results, strict=True))
    models = {info.model_id for info, _, _ in results}
    dimensions = {dim for _, dim, _ in results}
    routes = {route for _, _, route in results}
    if len(models) > 1 or len(dimensions) > 1:
        described = ", ".join(f"{s.endpoint.url} serves {s.info.model_id} ({dim} dims)"
                              for s, (_, dim, _) in zip(servers, results, strict=True))
        raise JobSpecError(f"the servers disagree on the model: {described}; point the job at servers "
                           "that serve one model", key="servers")
    model_id = models.pop()
    if expected_model and expected_model != model_id:
        raise JobSpecError(f"the job asks for {expected_model} but the servers serve {model_id}; "
                           "fix model.id or the servers", key="model.id")
    # All servers share one route so that every vector comes from the same code path.
    route = routes.pop() if len(routes) == 1 else "embed"
    return Fleet(servers=servers, model_id=model_id, dimension=dimensions.pop(), route=route)


async def _read_info(client: TeiClient, api_key_env: str | None) -> ServerInfo:
    with _naming_the_key(client, api_key_env):
        info = await client.info()
    if info.model_kind != "embedding":
        raise WrongModelKind(
            f"serves {info.model_id}, a {info.model_kind} model, not an embedding model; "
            "launch TEI with an embedding model for this job", server=client.url, status_code=None)
    return info


async def _probe(client: TeiClient, info: ServerInfo, options: EmbedOptions, requested_route: str,
                 api_key_env: str | None) -> tuple[ServerInfo, int, str]:
    route = choose_route(requested_route, options, info)
    packer = RequestPacker(route, options, max_batch_size=1, payload_limit=10**9)
    with _naming_the_key(client, api_key_env):
        vectors = await client.embed(packer.probe())
    return info, int(vectors.shape[1]), route


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
