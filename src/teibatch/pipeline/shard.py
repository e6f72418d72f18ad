"""One shard, start to finish: read it, embed it over the pool, write its parts (all or nothing)."""

from __future__ import annotations

import asyncio
import resource
import sys
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import numpy as np

from teibatch.corpus import Document, Reject, Shard, content_hash, read_shard
from teibatch.crashpoints import crashpoint
from teibatch.pipeline.context import ShardContext
from teibatch.sink import REJECTS_DIR, VECTORS_DIR, OutputStore, read_vectors, rejects_table, vectors_table, write_part
from teibatch.tei import EmbedResult, EndpointPool, RequestPacker, Server, TeiClient, embed_texts


@dataclass(frozen=True)
class ShardOutcome:
    """What a finished shard wrote; the driver commits it to the manifest."""

    shard_id: str
    read: int
    rows: int
    rejects: int
    reused: int = 0
    reject_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    servers: dict[str, dict[str, object]] = field(default_factory=dict)
    node: str | None = None
    peak_rss_mb: float = 0.0


def process_shard(shard: Shard, context: ShardContext, previous_parts: tuple[str, ...] = ()) -> ShardOutcome:
    """Embed ``shard`` and write its ``vectors/`` and ``rejects/`` parts; raise if it cannot finish.

    ``previous_parts`` are vectors parts of an earlier run that held this shard's documents; a
    document whose id and content hash are found there keeps its vector and is not sent again.
    """
    started = time.monotonic()
    documents: list[Document] = []
    rejects: list[Reject] = []
    for item in read_shard(context.corpus, shard):
        (documents if isinstance(item, Document) else rejects).append(item)  # type: ignore[arg-type]
    read = len(documents) + len(rejects)
    hashes = [content_hash(d.text, context.hash_options) for d in documents]
    store = OutputStore(context.output, context.output_options)
    known = read_vectors(store, previous_parts, {d.id for d in documents}) if previous_parts else {}
    vectors = np.zeros((len(documents), context.schema.dimension), dtype=np.float32)
    ok = np.zeros(len(documents), dtype=bool)
    truncated = np.zeros(len(documents), dtype=bool)
    to_embed = []
    for position, (document, digest) in enumerate(zip(documents, hashes, strict=True)):
        previous = known.get(document.id)
        if previous is not None and previous[0] == digest:
            vectors[position], truncated[position], ok[position] = previous[1], previous[2], True
        else:
            to_embed.append(position)
    reused = len(documents) - len(to_embed)
    server_stats: dict[str, dict[str, object]] = {}
    if to_embed:
        result, server_stats = asyncio.run(_embed([documents[p].text for p in to_embed], context))
        positions = np.asarray(to_embed, dtype=np.int64)
        vectors[positions] = result.vectors
        ok[positions] = result.ok
        truncated[positions] = result.truncated
        rejects += [Reject(documents[to_embed[f.position]].id, f.reason, f.detail) for f in result.failures]
    kept = [position for position in range(len(documents)) if ok[position]]
    # Rejects first: the vectors part is the one a reader sees, so it comes last.
    write_part(store, REJECTS_DIR, shard.id, rejects_table([r.id for r in rejects], [r.reason for r in rejects],
                                                           [r.detail for r in rejects]), context.write)
    crashpoint("shard-write")
    table = vectors_table(
        context.schema,
        ids=[documents[p].id for p in kept],
        vectors=vectors[kept],
        hashes=[hashes[p] for p in kept],
        truncated=truncated[kept],
        kept={name: [documents[p].fields.get(name) for p in kept] for name in context.schema.kept},
    )
    write_part(store, VECTORS_DIR, shard.id, table, context.write)
    return ShardOutcome(
        shard_id=shard.id, read=read, rows=len(kept), rejects=len(rejects), reused=reused,
        reject_reasons=dict(Counter(r.reason for r in rejects)),
        seconds=time.monotonic() - started, servers=server_stats, peak_rss_mb=peak_rss_mb(),
    )


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)


async def _embed(texts: list[str], context: ShardContext) -> tuple[EmbedResult, dict[str, dict[str, object]]]:
    connections = sum(max(1, p.limits.max_inflight_inputs // p.limits.max_batch_size) for p in context.servers)
    limits = httpx.Limits(max_connections=connections + len(context.servers),
                          max_keepalive_connections=connections + len(context.servers))
    async with httpx.AsyncClient(limits=limits) as http:
        servers = [Server(TeiClient(p.endpoint, http, timeout=context.request_timeout, model=context.model_id,
                                    api_key_env=context.api_key_env), p.limits)
                   for p in context.servers]
        pool = EndpointPool(servers)
        packer = RequestPacker(context.route, context.embed, max_batch_size=pool.max_batch_size,
                               payload_limit=pool.payload_limit)
        try:
            result = await embed_texts(pool, packer, texts, dimension=context.schema.dimension,
                                       max_retries=context.max_retries)
        finally:
            await pool.close()
        return result, pool.stats()
