"""Peak memory of the driver and the shard workers for a small and a 10x larger corpus.

Generates N short documents (jsonl, 10 files), runs ``teibatch run`` on two built-in servers,
reads the peak resident memory the run report records, and prints both sizes and their ratio.
The target: the 10x larger corpus needs less than 20% more memory.

    python benchmarks/bench_memory.py --small 100000 --large 1000000
    python benchmarks/bench_memory.py --no-id-field      # rows whose id is their place
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson
import yaml
from corpora import write_jsonl_corpus

FILES = 10
WORDS = 8


def run(documents: int, workdir: Path, servers: int, id_field: str | None) -> dict[str, float]:
    corpus = workdir / f"corpus-{documents}"
    write_jsonl_corpus(corpus, documents, WORDS, FILES)
    job = workdir / f"job-{documents}.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(corpus), "id_field": id_field, "shard_docs": 10_000},
        "servers": {"provider": "local", "count": servers, "server_args": ["--max-client-batch-size", "256"]},
        "output": {"path": str(workdir / f"out-{documents}")}}))
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "teibatch", "run", str(job), "-q"], capture_output=True,
                          text=True, check=False, env={**os.environ, "RAY_AUTH_MODE": "disabled"})
    if done.returncode != 0:
        raise SystemExit(f"run of {documents} documents failed:\n{done.stderr}")
    report = orjson.loads(next((workdir / f"out-{documents}" / "runs").iterdir()).read_bytes())
    if report["documents"]["embedded"] != documents:
        raise SystemExit(f"embedded {report['documents']['embedded']} of {documents} documents")
    return {"documents": documents, "seconds": round(time.monotonic() - started, 1),
            "embedded": report["documents"]["embedded"], **report["memory"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--small", type=int, default=100_000)
    parser.add_argument("--large", type=int, default=1_000_000)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--no-id-field", action="store_true",
                        help="rows without id_field (their place is their id): no id to check across shards")
    args = parser.parse_args()
    id_field = None if args.no_id_field else "id"
    with tempfile.TemporaryDirectory(prefix="teibatch-bench-memory-") as tmp:
        small = run(args.small, Path(tmp), args.servers, id_field)
        large = run(args.large, Path(tmp), args.servers, id_field)
    print(f"{'documents':>10} {'seconds':>8} {'docs/s':>8} {'driver MiB':>11} {'worker MiB':>11}")
    for result in (small, large):
        rate = result["documents"] / result["seconds"]
        print(f"{result['documents']:>10,} {result['seconds']:>8} {rate:>8,.0f} {result['driver_peak_rss_mb']:>11} "
              f"{result['worker_peak_rss_mb']:>11}")
    for key in ("driver_peak_rss_mb", "worker_peak_rss_mb"):
        growth = large[key] / small[key] - 1
        verdict = "ok" if growth < 0.20 else "OVER TARGET"
        print(f"{key}: {growth:+.1%} for {large['documents'] // small['documents']}x the documents ({verdict})")


if __name__ == "__main__":
    main()
