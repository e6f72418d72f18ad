"""Does a whole ``teibatch run`` (Ray, shard tasks, Parquet) keep simulated GPUs busy?

Starts ``--servers`` built-in servers with ``--simulate-gpu RATE`` (each answers like a GPU of RATE
tokens/s, with a fixed 2 ms per batch), generates a jsonl corpus, runs the job through the real
pipeline against them (``provider: static``), and compares the tokens the servers embedded per
second of the run's embedding phase with the sum of their configured rates. Target: at least 95%.

    .venv/bin/python benchmarks/bench_runner.py                 # 4 servers x 25,000 tokens/s
    .venv/bin/python benchmarks/bench_runner.py --rate 50000 --documents 60000

Only 127.0.0.1 is used; every server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import httpx
import yaml
from corpora import write_jsonl_corpus

from teibatch.fleet import LocalProvider
from teibatch.job import load_job
from teibatch.pipeline import run_job


def tokens_embedded(url: str) -> int:
    return int(httpx.get(f"{url}/teibatch/stats", timeout=10).json()["tokens_embedded"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--servers", type=int, default=4)
    parser.add_argument("--rate", type=float, default=25_000, help="tokens/s of each simulated GPU")
    parser.add_argument("--documents", type=int, default=40_000)
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--shard-docs", type=int, default=2_000)
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    provider = LocalProvider(args.servers, server_args=["--simulate-gpu", str(args.rate)])
    with tempfile.TemporaryDirectory(prefix="teibatch-bench-runner-") as tmp:
        write_jsonl_corpus(Path(tmp) / "corpus", args.documents, args.words)
        endpoints = provider.up()
        try:
            os.environ["BENCH_TEI_KEY"] = provider.api_key
            job_path = Path(tmp) / "job.yaml"
            job_path.write_text(yaml.safe_dump({
                "corpus": {"path": str(Path(tmp) / "corpus"), "id_field": "id", "shard_docs": args.shard_docs},
                "servers": {"provider": "static", "urls": [e.url for e in endpoints], "api_key_env": "BENCH_TEI_KEY"},
                "output": {"path": str(Path(tmp) / "out")}}))
            before = sum(tokens_embedded(e.url) for e in endpoints)
            started = time.monotonic()
            summary = run_job(load_job(job_path))
            wall = time.monotonic() - started
            tokens = sum(tokens_embedded(e.url) for e in endpoints) - before
        finally:
            provider.down()
    embed_s = summary.timings["embed_s"]
    capacity = args.servers * args.rate
    achieved = tokens / embed_s
    print(f"servers: {args.servers} x {args.rate:,.0f} tokens/s = {capacity:,.0f} tokens/s configured")
    print(f"documents: {summary.embedded:,} embedded in {embed_s:.1f}s of embedding ({wall:.1f}s with Ray start)")
    print(f"tokens embedded: {tokens:,} -> {achieved:,.0f} tokens/s = {achieved / capacity:.1%} of configured "
          f"({'ok' if achieved / capacity >= 0.95 else 'UNDER 95%'})")


if __name__ == "__main__":
    main()
