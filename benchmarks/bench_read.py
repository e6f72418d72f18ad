"""What reading a JSON-lines file costs, per codec, read as one shard and as many.

A shard of a file is a range of its rows. An uncompressed file's shards start where planning marked
their first row (``Shard.mark``); a compressed file cannot be sought, so each of its shards reads
past the rows before it. This writes one file of short documents per codec, plans it, and prints
the CPU per document of planning (counting the rows), of reading the file as one shard (the
baseline, measured in the same run), and of reading all of its ``shard_docs``-row shards one after
another, with the ratio of the last to the baseline: 1.0 means the shards cost no more than one
pass, ``(shards + 1) / 2`` that every shard reads the file from its start.

    python benchmarks/bench_read.py                        # 200,000 documents, shards of 10,000
    python benchmarks/bench_read.py --docs 1000000 --shard-docs 10000
"""

from __future__ import annotations

import argparse
import functools
import gzip
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import orjson
import zstandard

from teibatch.corpus import CorpusOptions, plan_shards, read_shard

CODECS: dict[str, tuple[str, Callable[[bytes], bytes]]] = {
    "none": ("", lambda data: data),
    "gzip": (".gz", lambda data: gzip.compress(data, compresslevel=6)),
    "zstd": (".zst", lambda data: zstandard.ZstdCompressor().compress(data)),
}


def corpus_bytes(documents: int) -> bytes:
    """JSON lines of short documents (about 30 words, a few hundred distinct words)."""
    return b"".join(orjson.dumps({"id": f"doc-{i}", "text": " ".join(f"w{(i * 7 + j) % 997}" for j in range(30))})
                    + b"\n" for i in range(documents))


def cpu_seconds(action: Callable[[], object], repeat: int) -> float:
    """The least CPU seconds ``action`` took over ``repeat`` runs."""
    best = float("inf")
    for _ in range(repeat):
        started = time.process_time()
        action()
        best = min(best, time.process_time() - started)
    return best


def read_all(options: CorpusOptions) -> int:
    return sum(1 for shard in plan_shards(options) for _ in read_shard(options, shard, verify=False))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--shard-docs", type=int, default=10_000)
    parser.add_argument("--codecs", default=",".join(CODECS), help="comma-separated: " + ", ".join(CODECS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    data = corpus_bytes(args.docs)
    shards = -(-args.docs // args.shard_docs)
    print(f"{args.docs:,} documents in one file, {shards} shards of {args.shard_docs:,}")
    print("| codec | plan µs/doc | one shard µs/doc | all shards µs/doc | all shards / one shard |")
    print("|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for codec in args.codecs.split(","):
            suffix, compress = CODECS[codec]
            path = Path(folder) / codec / f"corpus.jsonl{suffix}"
            path.parent.mkdir()
            path.write_bytes(compress(data))
            whole = CorpusOptions(str(path), id_field="id", shard_docs=args.docs)
            sharded = CorpusOptions(str(path), id_field="id", shard_docs=args.shard_docs)
            if read_all(whole) != args.docs or read_all(sharded) != args.docs:
                raise SystemExit(f"{codec}: the shards did not read {args.docs} documents")
            plan = cpu_seconds(functools.partial(plan_shards, sharded), args.repeat)
            one = cpu_seconds(functools.partial(read_all, whole), args.repeat) - plan
            many = cpu_seconds(functools.partial(read_all, sharded), args.repeat) - plan
            per_doc = 1e6 / args.docs
            print(f"| {codec} | {plan * per_doc:.2f} | {one * per_doc:.2f} | {many * per_doc:.2f} | {many / one:.2f} |")


if __name__ == "__main__":
    main()
