"""How much of the servers' capacity the TEI client uses, and what it costs in client CPU.

Not a test: it prints numbers, each beside a baseline measured in the same run.

1. **Capacity.** Starts ``--servers`` built-in servers (``python -m teibatch serve --simulate-gpu
   RATE``, each answering like a GPU of RATE tokens/s, with an API key) and embeds a corpus over all
   of them with :func:`teibatch.tei.embed_texts` (what each shard task runs; limits from ``/info``),
   once with ``route: auto`` (base64 here) and once with ``/embed``. Prints the tokens/s the servers
   embedded (from their ``/teibatch/stats``) against the summed configured rate; the target is at
   least 95%.
2. **Client CPU per million 1024-dimension vectors**, for ``/embed`` (JSON floats, orjson → numpy)
   and for ``/v1/embeddings`` with base64, beside a plain loop (``httpx.Client`` +
   ``response.json()`` + ``numpy``) against the same server. CPU is this process's
   (``time.process_time``); the server runs in its own process. Also the decoders alone, on one
   answer of each kind, beside ``json.loads``.
3. **HTTP client CPU per vector**: the same base64 requests of 32 texts (384 dimensions), 16 in flight,
   sent and read whole by a plain ``httpx.AsyncClient`` (httpcore's pool), by the client
   :func:`teibatch.tei.open_client` builds for ``http://`` servers (httpx over ``tei/wire.py``), by
   the one it builds for TLS and proxies (httpx over aiohttp, ``tei/transport.py``) and by a bare
   ``aiohttp.ClientSession``; nothing decoded, so the CPU is the HTTP client's (the least of
   ``--repeats`` runs, taken in turns). With ``--floor PATH`` it also runs that one-process floor script
   (``--client both``) and prints its ``HTTP (httpx)`` and ``HTTP (aiohttp)`` stages beside them.

Run (about 2 minutes on 2 cores)::

    .venv/bin/python benchmarks/bench_client.py
    .venv/bin/python benchmarks/bench_client.py --skip-capacity --skip-cpu --floor floor.py   # HTTP only

Only 127.0.0.1 is used; every server is stopped at the end, whatever happens.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import httpx
import numpy as np
import orjson
from corpora import synthetic_text

from teibatch.endpoint import Endpoint
from teibatch.fleet import LocalProvider
from teibatch.server.tokens import ApproxTokenizer
from teibatch.tei import (
    ROUTE_AUTO,
    ROUTE_EMBED,
    ROUTE_OPENAI_BASE64,
    ClientLimits,
    EmbedOptions,
    EndpointPool,
    RequestPacker,
    Server,
    TeiClient,
    choose_route,
    embed_texts,
    open_client,
)
from teibatch.tei.decode import decode_base64, decode_embed
from teibatch.tei.transport import AiohttpTransport, TeiHttpClient


def documents(count: int, words: int, seed: int = 0) -> list[str]:
    return [synthetic_text(i, words, prefix=f"doc {seed}-") for i in range(count)]


async def _embed(endpoints: list[Endpoint], texts: list[str], route: str,
                 dimension: int) -> tuple[dict[str, Any], str]:
    async with open_client([e.url for e in endpoints]) as http:
        servers, infos = [], []
        for endpoint in endpoints:
            client = TeiClient(endpoint, http)
            info = await client.info()
            infos.append(info)
            servers.append(Server(client, ClientLimits.derive(info)))
        chosen = choose_route(route, EmbedOptions(), infos[0])
        pool = EndpointPool(servers)
        packer = RequestPacker(chosen, EmbedOptions(), max_batch_size=pool.max_batch_size,
                               payload_limit=pool.payload_limit)
        try:
            result = await embed_texts(pool, packer, texts, dimension=dimension)
        finally:
            await pool.close()
        assert result.ok.all(), result.failures[:3]
        return pool.stats(), chosen


def _server_stats(endpoints: list[Endpoint], reset: bool = False) -> list[dict[str, Any]]:
    method = "DELETE" if reset else "GET"
    return [httpx.request(method, f"{e.url}/teibatch/stats", timeout=10).json() for e in endpoints]


def capacity(args: argparse.Namespace) -> dict[str, Any]:
    server_args = ["--simulate-gpu", str(args.rate)]
    provider = LocalProvider(args.servers, server_args=server_args, startup_timeout=60)
    endpoints = provider.up()
    try:
        tokens_per_doc = ApproxTokenizer().count(documents(1, args.words)[0])
        count = int(args.servers * args.rate * args.seconds / tokens_per_doc)
        asyncio.run(_embed(endpoints, documents(count // 20, args.words, seed=1), ROUTE_AUTO, 384))  # warm-up
        runs = {}
        for route in (ROUTE_AUTO, ROUTE_EMBED):
            _server_stats(endpoints, reset=True)
            texts = documents(count, args.words, seed=len(runs) + 2)
            started, cpu = time.monotonic(), time.process_time()
            stats, chosen = asyncio.run(_embed(endpoints, texts, route, 384))
            wall, cpu = time.monotonic() - started, time.process_time() - cpu
            served = _server_stats(endpoints)
            tokens = sum(s["tokens_embedded"] for s in served)
            configured = args.servers * args.rate
            runs[f"route {route} ({chosen})"] = {
                "documents": count, "wall_s": round(wall, 2), "tokens": tokens,
                "achieved_tokens_per_s": round(tokens / wall), "configured_tokens_per_s": configured,
                "ratio": round(tokens / wall / configured, 4), "client_cpu_s": round(cpu, 2),
                "violations": sum(sum(s["violations"].values()) for s in served),
                "window_decreases": sum(int(s["window_decreases"]) for s in stats.values())}
    finally:
        provider.down()
    return {"servers": args.servers, "rate_per_server": args.rate, "tokens_per_document": tokens_per_doc, **runs}


def _plain_loop(url: str, key: str, texts: list[str], batch: int) -> None:
    """What one writes without teibatch: one request at a time, httpx + json + numpy.

    Its vectors go into one result matrix, as the client's do (writing fresh memory has a cost).
    """
    result = np.zeros((len(texts), 1024), dtype=np.float32)
    with httpx.Client(headers={"authorization": f"Bearer {key}"}, timeout=60) as http:
        for i in range(0, len(texts), batch):
            response = http.post(f"{url}/embed", json={"inputs": texts[i:i + batch]})
            response.raise_for_status()
            result[i:i + batch] = np.array(response.json(), dtype=np.float32)


def cpu_per_million(args: argparse.Namespace) -> dict[str, Any]:
    provider = LocalProvider(1, server_args=["--dimension", "1024", "--max-concurrent-requests", "128"],
                             startup_timeout=60)
    (endpoint,) = provider.up()
    results: dict[str, Any] = {"vectors": args.vectors, "dimension": 1024}
    try:
        texts = [f"v {i}" for i in range(args.vectors)]
        asyncio.run(_embed([endpoint], texts[:256], ROUTE_EMBED, 1024))  # warm-up
        for name, run in (("plain_json_httpx", lambda: _plain_loop(endpoint.url, endpoint.api_key or "", texts, 32)),
                          ("embed", lambda: asyncio.run(_embed([endpoint], texts, ROUTE_EMBED, 1024))),
                          ("base64", lambda: asyncio.run(_embed([endpoint], texts, ROUTE_OPENAI_BASE64, 1024)))):
            cpu, wall = time.process_time(), time.monotonic()
            run()
            cpu, wall = time.process_time() - cpu, time.monotonic() - wall
            results[name] = {"cpu_s_per_1M": round(cpu / args.vectors * 1e6, 1), "wall_s": round(wall, 2)}
        with httpx.Client(headers={"authorization": f"Bearer {endpoint.api_key}"}, timeout=60) as http:
            body = {"inputs": texts[:32], "normalize": True}
            floats = http.post(f"{endpoint.url}/embed", json=body).content
            b64 = http.post(f"{endpoint.url}/v1/embeddings",
                            json={"input": texts[:32], "encoding_format": "base64"}).content
    finally:
        provider.down()
    decoders = {"json_loads_numpy": lambda: np.array(json.loads(floats), dtype=np.float32),
                "orjson_numpy (/embed)": lambda: decode_embed(floats),
                "base64 (/v1/embeddings)": lambda: decode_base64(b64)}
    assert np.array_equal(decoders["json_loads_numpy"](), decode_embed(floats))
    assert np.array_equal(decode_base64(b64), decode_embed(floats))
    results["decode_only_cpu_s_per_1M"] = {}
    for name, decode in decoders.items():
        repeats = 200
        cpu = time.process_time()
        for _ in range(repeats):
            decode()
        cpu = time.process_time() - cpu
        results["decode_only_cpu_s_per_1M"][name] = round(cpu / (repeats * 32) * 1e6, 1)
    return results


HTTP_BATCH = 32
HTTP_INFLIGHT = 16
Post = Callable[[bytes], Awaitable[None]]


@contextlib.asynccontextmanager
async def _httpx_poster(http: httpx.AsyncClient, url: str, headers: dict[str, str]) -> AsyncIterator[Post]:
    async with http:
        async def post(body: bytes) -> None:
            response = await http.post(url, content=body, headers=headers)
            assert response.status_code == 200, response.status_code

        yield post


@contextlib.asynccontextmanager
async def _aiohttp_poster(url: str, headers: dict[str, str]) -> AsyncIterator[Post]:
    async with aiohttp.ClientSession() as session:
        async def post(body: bytes) -> None:
            async with session.post(url, data=body, headers=headers) as response:
                await response.read()
                assert response.status == 200, response.status

        yield post


HTTP_CLIENTS: dict[str, Callable[[str, dict[str, str]], contextlib.AbstractAsyncContextManager[Post]]] = {
    "httpx (httpcore pool)": lambda url, headers: _httpx_poster(httpx.AsyncClient(
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None)), url, headers),
    "httpx over the wire transport (open_client)": lambda url, headers: _httpx_poster(
        open_client([url]), url, headers),
    "httpx over aiohttp (open_client for TLS, proxies)": lambda url, headers: _httpx_poster(
        TeiHttpClient(transport=AiohttpTransport()), url, headers),
    "aiohttp alone (one ClientSession)": _aiohttp_poster,
}


async def _post_all(client: contextlib.AbstractAsyncContextManager[Post], bodies: list[bytes]) -> None:
    """Every body, ``HTTP_INFLIGHT`` at a time, each answer read whole and not decoded."""
    queue = iter(bodies)  # shared by the workers: each takes the next body

    async def worker(post: Post) -> None:
        for body in queue:
            await post(body)

    async with client as post:
        await asyncio.gather(*(worker(post) for _ in range(HTTP_INFLIGHT)))


def _floor_http(path: Path, documents: int) -> dict[str, float]:
    """The floor script's HTTP stages, CPU µs per vector, for httpx and aiohttp (run beside, in its own process)."""
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "floor.jsonl"
        subprocess.run([sys.executable, str(path), "--documents", str(documents), "--dimension", "384",
                        "--client", "both", "--inflight", str(HTTP_INFLIGHT), "--json", str(out)],
                       check=True, stdout=subprocess.DEVNULL, timeout=1800)
        runs = [json.loads(line) for line in out.read_text().splitlines()]
    return {f"floor.py {r['client']}": round(r["stages"][f"HTTP ({r['client']})"] / r["vectors"] * 1e6, 1)
            for r in runs}


def http_cpu(args: argparse.Namespace) -> dict[str, Any]:
    """HTTP client CPU µs per vector: plain httpx, httpx over the wire transport and over aiohttp, aiohttp
    alone, and (``--floor``) the floor script's httpx and aiohttp."""
    provider = LocalProvider(1, server_args=["--dimension", "384", "--max-concurrent-requests", "1024"],
                             startup_timeout=60)
    (endpoint,) = provider.up()
    url = f"{endpoint.url}/v1/embeddings"
    headers = {"content-type": "application/json", "authorization": f"Bearer {endpoint.api_key}"}
    texts = documents(args.http_vectors, 24, seed=5)
    bodies = [orjson.dumps({"input": texts[i:i + HTTP_BATCH], "encoding_format": "base64"})
              for i in range(0, len(texts), HTTP_BATCH)]
    results: dict[str, Any] = {"vectors": len(texts), "texts_per_request": HTTP_BATCH, "in_flight": HTTP_INFLIGHT,
                               "dimension": 384, "us_per_vector": {}}
    try:
        for make in HTTP_CLIENTS.values():
            asyncio.run(_post_all(make(url, headers), bodies[:64]))  # warm-up: imports, first connections
        # Taken in turns, the least of --repeats each: the server shares the CPUs, and a slower answer
        # costs the client more wake-ups per request.
        measured: dict[str, list[float]] = {name: [] for name in HTTP_CLIENTS}
        for _ in range(args.repeats):
            for name, make in HTTP_CLIENTS.items():
                cpu = time.process_time()
                asyncio.run(_post_all(make(url, headers), bodies))
                measured[name].append((time.process_time() - cpu) / len(texts) * 1e6)
        results["us_per_vector"] = {name: round(min(runs), 1) for name, runs in measured.items()}
        results["all_runs_us_per_vector"] = {name: [round(r, 1) for r in runs] for name, runs in measured.items()}
    finally:
        provider.down()
    if args.floor is not None:
        results["us_per_vector"].update(_floor_http(args.floor, args.floor_documents))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=25_000.0, help="--simulate-gpu tokens/s per server")
    parser.add_argument("--seconds", type=float, default=25.0, help="planned length of each capacity run")
    parser.add_argument("--words", type=int, default=60, help="words per document (about one token each)")
    parser.add_argument("--vectors", type=int, default=16_384, help="vectors per CPU measurement")
    parser.add_argument("--http-vectors", type=int, default=64_000, help="vectors per HTTP client measurement")
    parser.add_argument("--repeats", type=int, default=3, help="HTTP measurements per client (the least is shown)")
    parser.add_argument("--floor", type=Path, help="the one-process floor script, run beside the HTTP section")
    parser.add_argument("--floor-documents", type=int, default=100_000, help="documents for the floor script")
    parser.add_argument("--skip-capacity", action="store_true")
    parser.add_argument("--skip-cpu", action="store_true")
    parser.add_argument("--skip-http", action="store_true")
    args = parser.parse_args()
    print(f"# bench_client on {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f}", flush=True)
    report: dict[str, Any] = {}
    if not args.skip_capacity:
        report["capacity"] = capacity(args)
        print(json.dumps({"capacity": report["capacity"]}, indent=2), flush=True)
    if not args.skip_cpu:
        report["cpu"] = cpu_per_million(args)
        cpu = report["cpu"]
        for name in ("embed", "base64"):
            cpu[name]["vs_plain"] = round(cpu["plain_json_httpx"]["cpu_s_per_1M"] / cpu[name]["cpu_s_per_1M"], 2)
        print(json.dumps({"cpu": cpu}, indent=2), flush=True)
    if not args.skip_http:
        report["http"] = http_cpu(args)
        print(json.dumps({"http": report["http"]}, indent=2), flush=True)
        print("\n| HTTP client | CPU µs/vector |\n|---|---:|")
        for name, micros in report["http"]["us_per_vector"].items():
            print(f"| {name} | {micros} |")
    ok = all(run["ratio"] >= 0.95 for run in report.get("capacity", {}).values() if isinstance(run, dict))
    print(f"# capacity target (>= 95% of summed configured rate): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
