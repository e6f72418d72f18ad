"""Are the servers busy? teibatch against a tuned single-process loop, on the same simulated GPUs.

Each scenario starts fresh built-in servers with ``--simulate-gpu RATE`` (a batch is answered after
2 ms + tokens / RATE seconds; batches run one at a time, like a GPU), once for each contestant:

* **teibatch** — the whole ``teibatch run`` (Ray, shard tasks, senders, Parquet) via ``run_job``;
* **loop** — a single asyncio process with one httpx client and, per server, exactly
  ``max_concurrent_requests`` inputs in flight in full batches: the tuned script a user would write.
  Its time covers the same job as teibatch's: read the JSONL corpus, embed it, write ids and vectors
  to one Parquet file (its sending alone is printed beside it). teibatch's time runs from the moment
  Ray and the servers are both ready: its senders' and workers' start, the handshake, the embedding.

Printed per scenario: the servers' busy share (model-busy seconds over the span from their first
batch to their last, read from each server's own ``/teibatch/stats``; the mean and the lowest),
each contestant's time, the ratio, and what teibatch's report says per server (mean inputs per
request, most inputs in flight seen), with the server's three longest idle waits between batches.
Targets: busy share >= 0.95, teibatch never slower than the loop.
With ``--repeat``, the median of each back-to-back pair's ratio is printed too: the machine's own
drift between runs (the loop's time alone moves by 0.3 s from round to round) cancels out of it.

    .venv/bin/python benchmarks/bench_busy.py                  # every scenario
    .venv/bin/python benchmarks/bench_busy.py --only tail --documents 5000
    .venv/bin/python benchmarks/bench_busy.py --repeat 3     # the median of three runs each

Only 127.0.0.1 is used; every server is stopped at the end of its scenario.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import tempfile
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import orjson
import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import ray
import yaml
from corpora import write_jsonl_corpus
from server_stats import busy_share, idle_waits

from teibatch.fleet import LocalProvider
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.ray_runtime import start_local_ray


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    servers: int = 3
    batch: int = 32
    inflight: int = 512
    files: int = 8
    shard_docs: int = 2_000
    ray_cpus: int = 2
    faults: tuple[str, ...] = ()
    server_args: tuple[str, ...] = field(default=())

    def args(self, rate: float) -> list[str]:
        return ["--simulate-gpu", str(rate), "--max-client-batch-size", str(self.batch),
                "--max-concurrent-requests", str(self.inflight), *self.faults]


SCENARIOS = [
    Scenario("tight-limits", "TEI limits --max-client-batch-size 8 --max-concurrent-requests 24; "
             "3 shards, 2 task slots", batch=8, inflight=24, files=3, shard_docs=10_000),
    Scenario("many-cpus", "TEI defaults (32 a request, 512 in flight); shard_docs 500; Ray declares 32 CPUs",
             shard_docs=500, ray_cpus=32),
    Scenario("tail", "one shard holds the whole corpus (the last shard of a run, alone)", files=1,
             shard_docs=1_000_000),
    Scenario("faults", "TEI defaults with injected faults: 2% 429, 1% 503, 1% dropped answers",
             faults=("--fault-seed", "7", "--fault-rate-429", "0.02", "--fault-rate-503", "0.01",
                     "--fault-rate-drop", "0.01")),
]


def server_stats(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/teibatch/stats", timeout=10).json())


def busy_shares(urls: list[str]) -> tuple[list[float], dict[str, str]]:
    """Each server's busy share, and its longest idle waits between batches (``longest_idle_gaps``)."""
    shares, waits = [], {}
    for url in urls:
        stats = server_stats(url)
        shares.append(busy_share(stats))
        waits[url] = idle_waits(stats)
    return shares, waits


def wait_quiet(threshold: float = 50.0, limit_s: float = 60.0) -> None:
    """Wait until the machine's CPUs are mostly idle (at most ``limit_s``)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline and psutil.cpu_percent(interval=1.0) > threshold:
        pass


def read_corpus(corpus: Path) -> tuple[list[str], list[str]]:
    """Ids and texts of every JSONL file of ``corpus``, in order: what the loop reads before it sends."""
    records = [orjson.loads(line) for path in sorted(corpus.glob("*.jsonl")) for line in path.read_bytes().splitlines()]
    return [r["id"] for r in records], [r["text"] for r in records]


async def budget_loop(urls: list[str], api_key: str, texts: list[str], batch: int, inflight: int) -> list[list[float]]:
    """The tuned alternative: per server, ``inflight // batch`` workers each sending one full batch at a time."""
    work = deque((start, texts[start:start + batch]) for start in range(0, len(texts), batch))
    vectors: list[list[float]] = [[] for _ in texts]
    workers_per_server = max(1, inflight // batch)
    headers = {"Authorization": f"Bearer {api_key}"}
    limits = httpx.Limits(max_connections=len(urls) * workers_per_server + len(urls))
    async with httpx.AsyncClient(limits=limits, headers=headers, timeout=60) as http:

        async def worker(url: str) -> None:
            while work:
                start, inputs = work.popleft()
                try:
                    response = await http.post(f"{url}/embed", json={"inputs": inputs})
                    response.raise_for_status()
                    vectors[start:start + len(inputs)] = response.json()
                except (httpx.HTTPError, ValueError):
                    work.append((start, inputs))  # 429, 503, a dropped answer: send it again later
                    await asyncio.sleep(0.05)

        await asyncio.gather(*(worker(url) for url in urls for _ in range(workers_per_server)))
    return vectors


def write_vectors(path: Path, ids: list[str], vectors: list[list[float]]) -> None:
    """One Parquet file of ids and float32 vectors: the loop's output, as its user would write it."""
    matrix = np.asarray(vectors, dtype=np.float32)
    embedding = pa.FixedSizeListArray.from_arrays(pa.array(matrix.reshape(-1)), matrix.shape[1])
    pq.write_table(pa.table({"id": ids, "embedding": embedding}), path)


@dataclass
class Result:
    seconds: float
    shares: list[float]
    waits: dict[str, str]  # per server, its longest idle waits between batches (server_stats.idle_waits)
    report: dict[str, dict[str, object]] = field(default_factory=dict)
    sending_seconds: float | None = None  # the loop only: its time without reading and writing


def run_teibatch(scenario: Scenario, rate: float, corpus: Path, tmp: Path) -> Result:
    provider = LocalProvider(scenario.servers, server_args=scenario.args(rate))
    endpoints = provider.up()
    try:
        os.environ["BENCH_TEI_KEY"] = provider.api_key
        job_path = tmp / f"{scenario.name}.yaml"
        job_path.write_text(yaml.safe_dump({
            "corpus": {"path": str(corpus), "id_field": "id", "shard_docs": scenario.shard_docs},
            "servers": {"provider": "static", "urls": [e.url for e in endpoints], "api_key_env": "BENCH_TEI_KEY"},
            "output": {"path": tempfile.mkdtemp(prefix=f"out-{scenario.name}-", dir=tmp)}}))
        start_local_ray(num_cpus=scenario.ray_cpus)  # as a run starts its own, but declaring ray_cpus
        wait_quiet()  # Ray pre-starts one worker per declared CPU: measure the run, not the cluster's boot
        try:
            summary = run_job(load_job(job_path))
        finally:
            ray.shutdown()
        # From the moment Ray and the servers are both ready: the senders' and workers' start, the
        # handshake (the whole of fleet_up_s for servers that are already running), the embedding.
        seconds = sum(summary.timings[k] for k in ("warm_up_s", "fleet_up_s", "embed_s"))
        return Result(seconds, *busy_shares([e.url for e in endpoints]), report=summary.servers)
    finally:
        provider.down()


def run_loop(scenario: Scenario, rate: float, corpus: Path, tmp: Path) -> Result:
    """The loop's whole job: read the corpus, embed it, write it."""
    provider = LocalProvider(scenario.servers, server_args=scenario.args(rate))
    endpoints = provider.up()
    try:
        started = time.monotonic()
        ids, texts = read_corpus(corpus)
        sending = time.monotonic()
        vectors = asyncio.run(budget_loop([e.url for e in endpoints], provider.api_key, texts, scenario.batch,
                                          scenario.inflight))
        sent = time.monotonic()
        assert all(vectors), f"the loop embedded {sum(map(bool, vectors))} of {len(texts)}"
        write_vectors(tmp / f"loop-{scenario.name}.parquet", ids, vectors)
        seconds = time.monotonic() - started
        return Result(seconds, *busy_shares([e.url for e in endpoints]), sending_seconds=sent - sending)
    finally:
        provider.down()


def median_run(results: list[Result]) -> Result:
    """The run of median time (the upper median of an even count), with its own busy shares and report."""
    return sorted(results, key=lambda r: r.seconds)[len(results) // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=25_000, help="tokens/s of each simulated GPU")
    parser.add_argument("--documents", type=int, default=20_000)
    parser.add_argument("--words", type=int, default=60)
    parser.add_argument("--only", action="append", choices=[s.name for s in SCENARIOS])
    parser.add_argument("--repeat", type=int, default=1,
                        help="runs of each contestant per scenario, alternating; the median run is shown")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    rows = []
    for scenario in SCENARIOS:
        if args.only and scenario.name not in args.only:
            continue
        with tempfile.TemporaryDirectory(prefix="teibatch-bench-busy-") as tmp_name:
            tmp = Path(tmp_name)
            corpus = tmp / "corpus"
            write_jsonl_corpus(corpus, args.documents, args.words, files=scenario.files)
            runs = [(run_teibatch(scenario, args.rate, corpus, tmp), run_loop(scenario, args.rate, corpus, tmp))
                    for _ in range(max(1, args.repeat))]
        ours, theirs = median_run([r[0] for r in runs]), median_run([r[1] for r in runs])
        pair_ratio = statistics.median(a.seconds / b.seconds for a, b in runs)
        rows.append((scenario, ours, theirs, pair_ratio))
        print(f"\n## {scenario.name}: {scenario.description}")
        if len(runs) > 1:
            print("  runs, teibatch s / loop s: " + ", ".join(f"{a.seconds:.2f} / {b.seconds:.2f}" for a, b in runs))
            print(f"  median of the runs' ratios (each pair ran back to back): {pair_ratio:.4f}")
        print(f"  {'':10} {'time s':>8} {'busy mean':>10} {'busy min':>9}")
        for label, result in (("teibatch", ours), ("loop", theirs)):
            print(f"  {label:10} {result.seconds:8.2f} {sum(result.shares) / len(result.shares):10.3f} "
                  f"{min(result.shares):9.3f}")
        print(f"  teibatch time / loop time: {ours.seconds / theirs.seconds:.2f} "
              f"(the loop's sending alone: {theirs.sending_seconds:.2f} s)")
        for url, stats in sorted(ours.report.items()):
            print(f"  {url}: {stats['requests']} requests, {stats['mean_inputs_per_request']} inputs/request, "
                  f"max in flight {stats['max_in_flight']}, client-side busy {stats['busy_share']}, "
                  f"mean in flight {stats['mean_in_flight']}, copies answered first {stats.get('copies_won')} of "
                  f"{stats.get('copies')}; longest idle waits {ours.waits.get(url, 'none')}")
    print("\n| scenario | teibatch s | loop s | ratio | median pair ratio | busy share teibatch (min) "
          "| busy share loop (min) |")
    print("|---|---|---|---|---|---|---|")
    for scenario, ours, theirs, pair_ratio in rows:
        print(f"| {scenario.name} | {ours.seconds:.2f} | {theirs.seconds:.2f} | {ours.seconds / theirs.seconds:.3f} | "
              f"{pair_ratio:.3f} | "
              f"{sum(ours.shares) / len(ours.shares):.3f} ({min(ours.shares):.3f}) | "
              f"{sum(theirs.shares) / len(theirs.shares):.3f} ({min(theirs.shares):.3f}) |")


if __name__ == "__main__":
    main()
