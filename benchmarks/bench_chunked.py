"""Long documents: a chunked run against the same run truncating, on the same simulated GPUs.

Writes a corpus of long documents (``long_corpus.py``: 2,000 to 20,000 tokens each by the built-in
server's hashing rule), starts ``--servers`` built-in servers with ``--simulate-gpu RATE`` (a batch
is answered after 2 ms + tokens / RATE seconds, one batch at a time, like a GPU) and
``--max-input-length``, and runs the whole ``teibatch run`` (Ray, shard tasks, senders, Parquet)
against them twice, the servers' counters reset in between:

* **chunked** — ``chunking: {strategy: tokens, overlap_tokens: --overlap}``, ``model.truncate: false``;
* **truncated** — no chunking, ``model.truncate: true``: each document cut at ``max_input_length``.

Per run: documents, inputs the servers embedded, *tokens embedded / tokens in the corpus* (the
servers' own token counts, less their special tokens and the run's probe, over the corpus counted
by the same rule; target 1.00 chunked with overlap 0), the servers' *busy share* (model-busy
seconds over the span from their first batch to their last, from ``/teibatch/stats``; target
>= 0.95), the embedding time, and the *client CPU*: CPU seconds of this process and every process
under it but the servers (Ray, the senders, the shard tasks), each sampled every 0.2 s, per 1M
rows written (chunks, or documents when truncating).

Then the chunking's own CPU, in this process on one thread (``RAYON_NUM_THREADS=1``): the chunker
over the whole corpus with the rule the run used, and, where ``tokenizers`` and the packaged
all-MiniLM-L6-v2 are installed, that tokenizer's ``encode_batch`` and the chunker counting with it,
over the first ``--cpu-sample`` documents (target: >= 1M tokens/s per core).

    .venv/bin/python benchmarks/bench_chunked.py                    # 2,000 documents
    .venv/bin/python benchmarks/bench_chunked.py --documents 200    # a quick try

Only 127.0.0.1 is used; every server is stopped at the end.
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import orjson
import psutil
import yaml
from long_corpus import write_long_corpus

SAMPLE_S = 0.2
CHUNK_BATCH_DOCS = 64
MINILM = "sentence-transformers/all-MiniLM-L6-v2"


class TreeCpu:
    """CPU seconds of this process and its descendants but ``exclude`` (the servers) while it runs.

    Each descendant is sampled every :data:`SAMPLE_S` and counted at its last sample (a process that
    ends between two samples loses at most that last slice); this process by its own rusage.
    """

    def __init__(self, exclude: set[int]) -> None:
        self.exclude = exclude
        self.seen: dict[int, float] = {}
        self.before: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _tree(self) -> dict[int, float]:
        times: dict[int, float] = {}
        for child in psutil.Process().children(recursive=True):
            if child.pid in self.exclude:
                continue
            try:
                cpu = child.cpu_times()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                continue
            times[child.pid] = cpu.user + cpu.system
        return times

    def _sample(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            self.seen.update(self._tree())

    def __enter__(self) -> TreeCpu:
        self.before = self._tree()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self._own = usage.ru_utime + usage.ru_stime
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.seen.update(self._tree())
        self._stop.set()
        self._thread.join()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        self.seconds = usage.ru_utime + usage.ru_stime - self._own + sum(
            cpu - self.before.get(pid, 0.0) for pid, cpu in self.seen.items())


def descendants(pids: Sequence[int]) -> set[int]:
    """``pids`` and every process under them."""
    found = set(pids)
    for pid in pids:
        try:
            found.update(child.pid for child in psutil.Process(pid).children(recursive=True))
        except psutil.NoSuchProcess:
            continue
    return found


def server_stats(url: str, key: str, *, reset: bool = False) -> dict[str, Any]:
    answer = httpx.request("DELETE" if reset else "GET", f"{url}/teibatch/stats",
                           headers={"authorization": f"Bearer {key}"}, timeout=10)
    answer.raise_for_status()
    return dict(answer.json())


def cpu_seconds(work: Callable[[], object]) -> float:
    """CPU seconds of all threads of this process while ``work`` runs."""
    started = time.process_time()
    work()
    return time.process_time() - started


def run_once(name: str, tmp: Path, corpus: Path, urls: list[str], key: str, args: argparse.Namespace,
             **sections: Any) -> dict[str, Any]:
    """One ``teibatch run`` of ``corpus`` against fresh counters; what the servers and the run say."""
    from teibatch.job import load_job
    from teibatch.pipeline import run_job

    for url in urls:
        server_stats(url, key, reset=True)
    job_path = tmp / f"{name}.yaml"
    job_path.write_text(yaml.safe_dump({
        "name": f"bench-{name}",
        "corpus": {"path": str(corpus), "id_field": "id", "shard_docs": args.shard_docs},
        "servers": {"provider": "static", "urls": urls, "api_key_env": "BENCH_TEI_KEY"},
        "output": {"path": str(tmp / "out" / name)}, **sections}))
    with TreeCpu(set(args.server_pids)) as cpu:
        summary = run_job(load_job(job_path))
    stats = [server_stats(url, key) for url in urls]
    return {"summary": summary.to_json(), "stats": stats, "cpu_s": cpu.seconds}


def chunker_rates(documents: list[str], max_tokens: int, overlap: int, sample: int) -> list[tuple[str, float]]:
    """Tokens per CPU second on one thread: the chunker with the hashing rule over every document, and
    ``tokenizers``' encode_batch and the chunker with MiniLM's tokenizer over the first ``sample``."""
    from teibatch.corpus.chunking import Chunker, ChunkingOptions
    from teibatch.corpus.token_count import ApproxTokenCounter

    rows = []
    batches = [documents[i:i + CHUNK_BATCH_DOCS] for i in range(0, len(documents), CHUNK_BATCH_DOCS)]
    counter = ApproxTokenCounter()
    tokens = sum(counter.counts(documents)) - counter.special_tokens * len(documents)
    chunker = Chunker(ChunkingOptions(max_tokens, overlap, "tokens"), counter)
    seconds = cpu_seconds(lambda: [chunker.chunk_batch(batch) for batch in batches])
    rows.append((f"chunker, hashing rule (the run's), {len(documents):,} documents", tokens / seconds))
    try:
        from tokenizers import Tokenizer

        from teibatch.corpus.token_count import HFTokenCounter
        from teibatch.corpus.tokenizer_files import find_tokenizer_file

        tokenizer = Tokenizer.from_file(str(find_tokenizer_file(MINILM)))
    except Exception as exc:  # tokenizers or the packaged model missing: that part is skipped
        print(f"(no MiniLM tokenizer here: {exc})")
        return rows
    hf, whole = HFTokenCounter(tokenizer), HFTokenCounter(tokenizer, by_words=False)  # the chunker's; the baseline
    batches = [documents[i:min(i + CHUNK_BATCH_DOCS, sample)] for i in range(0, min(sample, len(documents)),
                                                                         CHUNK_BATCH_DOCS)]
    offsets: list[list[tuple[int, int]]] = []
    seconds = cpu_seconds(lambda: [offsets.extend(whole.offsets(batch)) for batch in batches])
    tokens = sum(len(o) for o in offsets)
    rows.append((f"tokenizers encode_batch, MiniLM, {sum(map(len, batches)):,} documents", tokens / seconds))
    chunker = Chunker(ChunkingOptions(max_tokens, overlap, "tokens"), hf)
    seconds = cpu_seconds(lambda: [chunker.chunk_batch(batch) for batch in batches])
    rows.append((f"chunker, MiniLM tokenizer, {sum(map(len, batches)):,} documents", tokens / seconds))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=2_000)
    parser.add_argument("--servers", type=int, default=2)
    parser.add_argument("--rate", type=float, default=100_000, help="tokens/s of each simulated GPU")
    parser.add_argument("--max-input-length", type=int, default=512)
    parser.add_argument("--overlap", type=int, default=0, help="chunking.overlap_tokens")
    parser.add_argument("--shard-docs", type=int, default=100)
    parser.add_argument("--cpu-sample", type=int, default=200, help="documents for the MiniLM tokenizer's rates")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ["RAYON_NUM_THREADS"] = "1"  # per core: before any tokenizers thread pool starts

    from teibatch.fleet import LocalProvider
    from teibatch.server.tokens import ApproxTokenizer
    from teibatch.tei.packing import PROBE_TEXT

    rule = ApproxTokenizer()
    with tempfile.TemporaryDirectory(prefix="teibatch-bench-chunked-") as folder:
        tmp = Path(folder)
        corpus = write_long_corpus(tmp / "corpus" / "long.jsonl", args.documents)
        print(f"corpus: {corpus.documents:,} documents, {corpus.tokens:,} tokens ({corpus.min_tokens:,} to "
              f"{corpus.max_tokens:,} each, hashing rule, special tokens left out), {corpus.bytes / 2**20:.0f} MiB")
        provider = LocalProvider(args.servers, server_args=["--simulate-gpu", str(args.rate),
                                                            "--max-input-length", str(args.max_input_length)])
        endpoints = provider.up()
        try:
            os.environ["BENCH_TEI_KEY"] = provider.api_key
            args.server_pids = descendants([child.pid for child in psutil.Process().children()])
            urls = [e.url for e in endpoints]
            runs = {
                "chunked": run_once("chunked", tmp, corpus.path.parent, urls, provider.api_key, args,
                                    model={"truncate": False},
                                    chunking={"strategy": "tokens", "overlap_tokens": args.overlap}),
                "truncated": run_once("truncated", tmp, corpus.path.parent, urls, provider.api_key, args,
                                      model={"truncate": True}),
            }
        finally:
            provider.down()
        documents = [orjson.loads(line)["text"] for line in corpus.path.read_bytes().splitlines()]
    probe_tokens = rule.count(PROBE_TEXT) - rule.special_tokens
    print(f"servers: {args.servers} x {args.rate:,.0f} tokens/s simulated, max_input_length "
          f"{args.max_input_length}; chunked: strategy tokens, overlap {args.overlap}; shard_docs {args.shard_docs}")
    print(f"{'run':<10} {'documents':>9} {'rows':>7} {'inputs':>7} {'embedded/corpus':>15} {'busy mean':>9} "
          f"{'busy min':>8} {'embed s':>7} {'client CPU s':>12} {'CPU s / 1M rows':>15}")
    for name, run in runs.items():
        stats, report = run["stats"], run["summary"]
        rows = report["chunking"]["chunks"] if "chunking" in report else report["documents"]["embedded"]
        inputs = sum(s["inputs_embedded"] for s in stats) - len(stats)  # less each server's probe
        tokens = sum(s["tokens_embedded"] for s in stats) - len(stats) * (probe_tokens + rule.special_tokens)
        content = tokens - inputs * rule.special_tokens
        shares = [s["model_busy_seconds"] / s["serving_span_seconds"] for s in stats if s["serving_span_seconds"]]
        print(f"{name:<10} {report['documents']['embedded']:>9,} {rows:>7,} {inputs:>7,} "
              f"{content / corpus.tokens:>15.3f} {sum(shares) / len(shares):>9.3f} {min(shares):>8.3f} "
              f"{report['timings']['embed_s']:>7.1f} {run['cpu_s']:>12.1f} {run['cpu_s'] / rows * 1e6:>15,.0f}")
        copies = sum(server.get("copies", 0) for server in report["servers"].values())
        if copies:
            print(f"{'':<10} (inputs above rows: the senders' {copies} tail copies, requests sent to a second "
                  "server when the first was slow; the servers embed both)")
    chunking = runs["chunked"]["summary"]["chunking"]
    sent = chunking["tokens_embedded"] - chunking["chunks"] * rule.special_tokens
    print(f"the chunked run's report: {chunking['chunks']:,} chunks, {chunking['tokens_embedded']:,} tokens embedded "
          f"as the servers count them, {sent / corpus.tokens:.3f} of the corpus without special tokens or copies; "
          f"tokenizer {chunking['tokenizer']}")
    print("chunking's own CPU, one thread:")
    for label, rate in chunker_rates(documents, args.max_input_length, args.overlap, args.cpu_sample):
        print(f"  {label}: {rate:,.0f} tokens/s = {1e6 / rate:.2f} CPU s per 1M tokens")


if __name__ == "__main__":
    main()
