"""The chunker's speed per core, against the tokenizer's own batch encode measured in the same run.

Generates long documents (2,000 to 20,000 tokens each by the tokenizer measured; ``long_corpus.py``:
English prose from the Python docs that ship with the interpreter, some sentences in other scripts,
in paragraphs, drawn with a fixed seed), pins the
tokenizer's thread count (``RAYON_NUM_THREADS``, 1 by default: per core), then times:

* ``encode_batch``: the tokenizer alone, one batch call per batch of documents, with the offsets
  the chunker needs (the baseline: a chunker cannot be faster than this);
* the chunker, for each strategy and overlap, over the same batches.

Per row: document tokens per CPU second (all threads' CPU time, so per core whatever the thread
count), the ratio to the baseline, chunks, mean tokens per chunk as the server counts them, tokens
embedded / tokens in the corpus (special tokens left out), and the share of the corpus's
characters the chunker had to count again to keep every chunk within ``max_tokens``.

    python benchmarks/bench_chunking.py                        # all-MiniLM-L6-v2's tokenizer, 1 thread
    python benchmarks/bench_chunking.py --threads 4 --documents 400
    python benchmarks/bench_chunking.py --tokenizer path/to/tokenizer.json --max-tokens 512
    python benchmarks/bench_chunking.py --rule hashing        # the built-in server's default rule
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from long_corpus import long_documents


class CountingCounter:
    """A counter that tallies the characters the chunker counts again (its ``counts`` calls)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.special_tokens = inner.special_tokens
        self.cuts = inner.cuts
        self.recounted_chars = 0
        self.recount_calls = 0

    def offsets(self, texts: Sequence[str]):
        return self.inner.offsets(texts)

    def counts(self, texts: Sequence[str]):
        self.recount_calls += 1
        self.recounted_chars += sum(len(text) for text in texts)
        return self.inner.counts(texts)


def timed(work) -> tuple[float, object]:
    """CPU seconds of all threads, and the result."""
    started = time.process_time()
    result = work()
    return time.process_time() - started, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--batch", type=int, default=64, help="documents per chunk_batch call")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--overlaps", default="0,32", help="comma-separated overlap_tokens values")
    parser.add_argument("--threads", type=int, default=1, help="RAYON_NUM_THREADS for the tokenizer")
    parser.add_argument("--rule", choices=("hf", "hashing"), default="hf")
    parser.add_argument("--tokenizer", help="a tokenizer.json (default: all-MiniLM-L6-v2's, from its package)")
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before the tokenizer's thread pool starts

    from teibatch.corpus.chunking import Chunker, ChunkingOptions
    from teibatch.corpus.token_count import ApproxTokenCounter
    from teibatch.corpus.tokenizer_files import load_token_counter

    if args.rule == "hashing":
        counter = ApproxTokenCounter()
        name = "hashing (built-in server)"
    else:
        counter = load_token_counter("sentence-transformers/all-MiniLM-L6-v2", path=args.tokenizer)
        name = args.tokenizer or "all-MiniLM-L6-v2"
    special = counter.special_tokens
    documents = [text for text, _ in long_documents(
        args.documents, seed=args.seed, count_tokens=lambda texts: [n - special for n in counter.counts(texts)])]
    batches = [documents[i:i + args.batch] for i in range(0, len(documents), args.batch)]

    base_seconds, offsets = timed(lambda: [o for batch in batches for o in counter.offsets(batch)])
    corpus_tokens = sum(len(o) for o in offsets)
    corpus_chars = sum(len(d) for d in documents)
    sizes = [len(o) for o in offsets]
    print(f"rule: {name} ({counter.cuts} cuts), RAYON_NUM_THREADS={args.threads}, max_tokens {args.max_tokens}")
    print(f"corpus: {len(documents):,} documents, {corpus_tokens:,} tokens ({min(sizes):,} to {max(sizes):,} "
          f"each), {corpus_chars:,} characters; python {sys.version.split()[0]}")
    header = (f"{'strategy':<11} {'overlap':>7} {'tokens/s/core':>14} {'vs encode':>9} {'chunks':>8} "
              f"{'tok/chunk':>9} {'embedded/corpus':>15} {'recounted':>9}")
    print(header)
    print(f"{'encode_batch':<11} {'-':>7} {corpus_tokens / base_seconds:>14,.0f} {1:>9.2f}")
    for strategy in ("tokens", "sentences", "paragraphs"):
        for overlap in (int(value) for value in args.overlaps.split(",")):
            counting = CountingCounter(counter)
            chunker = Chunker(ChunkingOptions(args.max_tokens, overlap, strategy), counting)
            seconds, results = timed(lambda c=chunker: [d for batch in batches for d in c.chunk_batch(batch)])
            chunks = [chunk for result in results for chunk in result.chunks]
            assert all(chunk.tokens <= args.max_tokens for chunk in chunks)
            embedded = sum(chunk.tokens - special for chunk in chunks)
            rate = corpus_tokens / seconds
            print(f"{strategy:<11} {overlap:>7} {rate:>14,.0f} {rate / (corpus_tokens / base_seconds):>9.2f} "
                  f"{len(chunks):>8,} {embedded / len(chunks) + special:>9.1f} {embedded / corpus_tokens:>15.3f} "
                  f"{counting.recounted_chars / corpus_chars:>9.1%}")
    chunker = Chunker(ChunkingOptions(args.max_tokens * 4, 0, "chars"))
    seconds, results = timed(lambda: [d for batch in batches for d in chunker.chunk_batch(batch)])
    print(f"chars ({args.max_tokens * 4} characters a chunk): {corpus_chars / seconds:,.0f} characters/s/core, "
          f"{sum(len(r.chunks) for r in results):,} chunks")


if __name__ == "__main__":
    main()
