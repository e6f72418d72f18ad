"""Deduplication: texts the servers embed with and without it, on a corpus where 30% of documents repeat.

Writes ``--documents`` documents in 8 JSONL files; ``--repeat`` of them (a share) carry the text of
another document picked at random anywhere in the corpus (the same shard, another shard of the same
file, another file). Starts ``--servers`` built-in servers with ``--simulate-gpu RATE`` and runs the
whole ``teibatch run`` (Ray, shard tasks, senders, Parquet) twice against them, the servers'
counters reset in between: ``corpus.deduplicate: true`` (the default), then ``false``. Per run: the
rows written, the inputs the servers embedded (less each server's probe; the senders' tail copies,
requests sent to a second server at the end of a run, are embedded twice and counted), how many
distinct texts those were (``--record-texts``), the report's ``documents.deduplicated``, the
embedding time; then whether both outputs are equal row for row (ids, hashes, vectors bit for bit).

    .venv/bin/python benchmarks/bench_dedup.py                      # 20,000 documents
    .venv/bin/python benchmarks/bench_dedup.py --documents 2000     # a quick try

``--protocol-only`` measures the cross-shard protocol alone, no servers and no files: the registry
actor of a private local Ray and ``--concurrent`` shards (``ShardCopies`` in this process, each
claiming, landing made-up vectors of ``--dimension`` floats, waiting and ending the way a shard task
does, in waves of ``--concurrent`` interleaved a claim batch at a time) over ``--vectors`` texts,
``--repeats`` of them repeating an earlier text. Per share of repeats: the registry actor's CPU
seconds (user + system, from its process) per 1M vectors, this process's, which plays the shards,
and the megabytes of vectors published to the registry (where its code counts them). It only uses
``ShardCopies``' and ``Dedup``'s public calls, so it runs against older code too.

    .venv/bin/python benchmarks/bench_dedup.py --protocol-only                 # 200,000 vectors
    .venv/bin/python benchmarks/bench_dedup.py --protocol-only --vectors 20000 # a quick try

Only 127.0.0.1 is used; every server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import orjson
import psutil
import pyarrow.dataset as ds
import yaml
from bench_chunked import server_stats

FILES = 8
WORDS = ("index", "vector", "server", "batch", "shard", "corpus", "token", "query", "model", "output")


def write_corpus(root: Path, documents: int, repeat: float, seed: int = 26) -> int:
    """The corpus; returns how many distinct texts it holds."""
    rng = random.Random(seed)
    texts: list[str] = []
    for n in range(documents):
        if n and rng.random() < repeat:
            texts.append(texts[rng.randrange(n)])
        else:
            words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
            texts.append(f"document {n}: {words}")
    root.mkdir(parents=True, exist_ok=True)
    per_file = -(-documents // FILES)
    for f in range(FILES):
        rows = texts[f * per_file:(f + 1) * per_file]
        (root / f"part-{f}.jsonl").write_bytes(b"".join(
            orjson.dumps({"id": f"{f}-{i}", "text": text}) + b"\n" for i, text in enumerate(rows)))
    return len(set(texts))


def run_once(name: str, tmp: Path, urls: list[str], key: str, args: argparse.Namespace,
             deduplicate: bool) -> dict[str, Any]:
    """One ``teibatch run`` of the corpus against fresh counters; what the servers and the run say."""
    from teibatch.job import load_job
    from teibatch.pipeline import run_job
    from teibatch.server import text_digest
    from teibatch.tei.packing import PROBE_TEXT

    for url in urls:
        server_stats(url, key, reset=True)
    job_path = tmp / f"{name}.yaml"
    job_path.write_text(yaml.safe_dump({
        "name": f"bench-{name}",
        "corpus": {"path": str(tmp / "corpus"), "id_field": "id", "shard_docs": args.shard_docs,
                   "deduplicate": deduplicate},
        "servers": {"provider": "static", "urls": urls, "api_key_env": "BENCH_TEI_KEY"},
        "output": {"path": str(tmp / "out" / name)}}))
    report = run_job(load_job(job_path)).to_json()
    stats = [server_stats(url, key) for url in urls]
    distinct = set().union(*(s["texts"] for s in stats)) - {text_digest(PROBE_TEXT)}
    return {"report": report, "inputs": sum(s["inputs_embedded"] for s in stats) - len(stats),
            "distinct": len(distinct), "copies": sum(server.get("copies", 0) for server in report["servers"].values()),
            "table": ds.dataset(tmp / "out" / name / "vectors").to_table().sort_by("id")}


def protocol_texts(vectors: int, repeat: float, seed: int = 34) -> list[int]:
    """Text ids of the protocol-only corpus: ``repeat`` of them repeat an earlier one, picked at random."""
    rng = random.Random(seed)
    texts: list[int] = []
    for n in range(vectors):
        texts.append(texts[rng.randrange(n)] if n and rng.random() < repeat else n)
    return texts


def protocol_cpu(vectors: int, repeat: float, args: argparse.Namespace) -> tuple[float, float, int | None]:
    """CPU seconds of the registry actor, and of this process (the shards), for one protocol-only corpus;
    and the bytes of vectors published to the registry (``None``: its code does not count them)."""
    import ray

    from teibatch.pipeline.dedup import CLAIM_BATCH, Dedup, ShardCopies

    texts = protocol_texts(vectors, repeat)
    block = np.random.default_rng(0).standard_normal((CLAIM_BATCH, args.dimension)).astype(np.float32)
    dedup = Dedup.for_run(request_timeout=60.0)
    registry = psutil.Process(ray.get(dedup.registry.__ray_call__.remote(lambda _: os.getpid())))
    ray.get(dedup.registry.stats.remote())
    before, mine = registry.cpu_times(), time.process_time()
    shards = [texts[start:start + args.shard_docs] for start in range(0, vectors, args.shard_docs)]
    for wave in range(0, len(shards), args.concurrent):
        group = [ShardCopies(f"shard-{wave + n}", [f"{text:032x}" for text in shard], dedup)
                 for n, shard in enumerate(shards[wave:wave + args.concurrent])]
        for start in range(0, args.shard_docs, CLAIM_BATCH):
            for copies in group:
                batch = [(unit, "") for unit in range(start, min(start + CLAIM_BATCH, len(copies.hashes)))]
                sent = [unit for unit, _ in copies.decide(batch)]
                ok = np.ones(len(sent), dtype=bool)
                copies.landed(sent, block[:len(sent)], ok, ~ok)
        for copies in group:
            late = [unit for unit, _ in copies.wait()]
            ok = np.ones(len(late), dtype=bool)
            copies.landed(late, block[:len(late)], ok, ~ok, publish=False)
            copies.release()
    stats = ray.get(dedup.registry.stats.remote())  # every call before it has run
    after = registry.cpu_times()
    shards_cpu = time.process_time() - mine
    ray.kill(dedup.registry)
    return after.user + after.system - before.user - before.system, shards_cpu, stats.get("published_bytes")


def protocol_only(args: argparse.Namespace) -> None:
    """The ``--protocol-only`` table."""
    from teibatch.pipeline.ray_runtime import start_local_ray

    start_local_ray(num_cpus=2)
    print(f"{args.vectors:,} vectors of {args.dimension} floats; shards of {args.shard_docs}, "
          f"{args.concurrent} at a time")
    print(f"{'repeats':>7} {'registry CPU s / 1M vectors':>27} {'shards CPU s / 1M vectors':>25} "
          f"{'MB published':>12}")
    for repeat in (float(r) for r in args.repeats.split(",")):
        registry, shards, published = protocol_cpu(args.vectors, repeat, args)
        scale = 1e6 / args.vectors
        megabytes = "not counted" if published is None else f"{published / 1e6:.1f}"
        print(f"{repeat:>7.0%} {registry * scale:>27.2f} {shards * scale:>25.2f} {megabytes:>12}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--repeat", type=float, default=0.3, help="share of documents that repeat another's text")
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100_000, help="tokens/s of each simulated GPU")
    parser.add_argument("--shard-docs", type=int, default=1_000)
    parser.add_argument("--protocol-only", action="store_true", help="the registry's CPU alone (see above)")
    parser.add_argument("--vectors", type=int, default=200_000, help="--protocol-only: texts in all")
    parser.add_argument("--dimension", type=int, default=1_024, help="--protocol-only: floats per vector")
    parser.add_argument("--concurrent", type=int, default=4, help="--protocol-only: shards running at once")
    parser.add_argument("--repeats", default="0,0.1,0.5", help="--protocol-only: shares of repeated texts")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    if args.protocol_only:
        protocol_only(args)
        return

    from teibatch.fleet import LocalProvider

    with tempfile.TemporaryDirectory(prefix="teibatch-bench-dedup-") as folder:
        tmp = Path(folder)
        distinct = write_corpus(tmp / "corpus", args.documents, args.repeat)
        provider = LocalProvider(args.servers, server_args=["--simulate-gpu", str(args.rate), "--record-texts"])
        endpoints = provider.up()
        try:
            os.environ["BENCH_TEI_KEY"] = provider.api_key or ""
            urls = [e.url for e in endpoints]
            runs = {name: run_once(name, tmp, urls, provider.api_key or "", args, deduplicate=name == "on")
                    for name in ("on", "off")}
        finally:
            provider.down()
    print(f"corpus: {args.documents:,} documents in {FILES} files, {distinct:,} distinct texts; shard_docs "
          f"{args.shard_docs}; servers: {args.servers} x {args.rate:,.0f} tokens/s simulated")
    print(f"{'deduplicate':<11} {'rows':>7} {'inputs embedded':>15} {'/ rows':>6} {'distinct texts':>14} "
          f"{'deduplicated':>12} {'embed s':>7} {'tail copies':>11}")
    for name, run in runs.items():
        rows = run["table"].num_rows
        print(f"{name:<11} {rows:>7,} {run['inputs']:>15,} {run['inputs'] / rows:>6.3f} {run['distinct']:>14,} "
              f"{run['report']['documents'].get('deduplicated', 0):>12,} "
              f"{run['report']['timings']['embed_s']:>7.1f} {run['copies']:>11}")
    print(f"outputs equal row for row: {runs['on']['table'].equals(runs['off']['table'])}")


if __name__ == "__main__":
    main()
