"""One shard, start to finish: read it, embed it over the pool, write its parts (all or nothing)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from dataclasses import dataclass, field

import httpx
import numpy as np

from teibatch.corpus import Document, Reject, Shard, content_hash, read_shard
from teibatch.pipeline.context import ShardContext
from teibatch.sink import REJECTS_DIR, VECTORS_DIR, OutputStore, rejects_table, vectors_table, write_part
from teibatch.tei import EmbedResult, EndpointPool, RequestPacker, Server, TeiClient, embed_texts


@dataclass(frozen=True)
class ShardOutcome:
    """What a finished shard wrote; the driver commits it to the manifest."""

    shard_id: str
    read: int
    rows: int
    rejects: int
    reject_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    servers: dict[str, dict[str, object]] = field(default_factory=dict)


def process_shard(shard: Shard, context: ShardContext) -> ShardOutcome:
    """Embed ``shard`` and write ``vectors/`` and ``rejects/`` parts; raise if it cannot finish."""
    started = time.monotonic()
    documents: list[Document] = []
    rejects: list[Reject] = []
    for item in read_shard(context.corpus, shard):
        if isinstance(item, Document):
            documents.append(item)
        else:
            rejects.append(item)
    read = len(documents) + len(rejects)
    result, server_stats = asyncio.run(_embed([d.text for d in documents], context))
    for failure in result.failures:
        document = documents[failure.position]
        rejects.append(Reject(document.id, failure.reason, failure.detail))
    kept_documents = [d for d, ok in zip(documents, result.ok, strict=True) if ok]
    store = OutputStore(context.output, context.output_options)
    # Rejects first: the vectors part is the one a reader sees, so it comes last.
    write_part(store, REJECTS_DIR, shard.id, rejects_table([r.id for r in rejects], [r.reason for r in rejects],
                                                           [r.detail for r in rejects]), context.write)
    table = vectors_table(
        context.schema,
        ids=[d.id for d in kept_documents],
        vectors=result.vectors[result.ok] if len(documents) else np.zeros((0, context.schema.dimension)),
        hashes=[content_hash(d.text, context.hash_options) for d in kept_documents],
        kept={name: [d.fields.get(name) for d in kept_documents] for name in context.schema.kept},
    )
    write_part(store, VECTORS_DIR, shard.id, table, context.write)
    return ShardOutcome(
        shard_id=shard.id, read=read, rows=len(kept_documents), rejects=len(rejects),
        reject_reasons=dict(Counter(r.reason for r in rejects)),
        seconds=time.monotonic() - started, servers=server_stats,
    )


async def _embed(texts: list[str], context: ShardContext) -> tuple[EmbedResult, dict[str, dict[str, object]]]:
    connections = sum(max(1, p.limits.max_inflight_inputs // p.limits.max_batch_size) for p in context.servers)
    limits = httpx.Limits(max_connections=connections + len(context.servers),
                          max_keepalive_connections=connections + len(context.servers))
    async with httpx.AsyncClient(limits=limits) as http:
        servers = [Server(TeiClient(p.endpoint, http, timeout=context.request_timeout), p.limits)
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
