"""The chunker's speed per core, against the tokenizer's own batch encode measured in the same run.

Generates long documents (2,000 to 20,000 tokens each by the tokenizer measured; ``long_corpus.py``:
English prose from the Python docs that ship with the interpreter, some sentences in other scripts,
in paragraphs, drawn with a fixed seed) or reads the standard library's module sources of that
length (``--corpus stdlib``: code, whose words rarely repeat), pins the tokenizer's thread count
(``RAYON_NUM_THREADS``, 1 by default: per core), then times, each the best of ``--repeat`` runs:

* ``encode_batch``: the tokenizer alone, one batch call per batch of documents, with the offsets
  the chunker needs (the baseline: what the chunker did before it counted word by word);
* ``encode_batch_fast``: the same without offsets (counts only, the tokenizer's fastest call);
* the chunker, for each strategy and overlap, over the same batches, each run with a new counter
  (its word cache empty at the start: see ``teibatch.corpus.word_counts``); and, for ``tokens``,
  the chunker with every document encoded whole (``whole``, the path of tokenizers whose counts
  do not add up at whitespace).

Per row: document tokens per CPU second (all threads' CPU time, so per core whatever the thread
count), the ratio to ``encode_batch``, chunks, mean tokens per chunk as the server counts them,
tokens embedded / tokens in the corpus (special tokens left out), the share of the corpus's
characters the chunker had to count again to keep every chunk within ``max_tokens``, and the
words the tokenizer was asked to encode per 100 words of the corpus (the word cache's misses).

    python benchmarks/bench_chunking.py                        # all-MiniLM-L6-v2's tokenizer, 1 thread
    python benchmarks/bench_chunking.py --corpus stdlib        # code: few repeated words
    python benchmarks/bench_chunking.py --threads 4 --documents 400
    python benchmarks/bench_chunking.py --tokenizer path/to/tokenizer.json --max-tokens 512
    python benchmarks/bench_chunking.py --rule hashing        # the built-in server's default rule
"""

from __future__ import annotations

import argparse
import os
import sys
import sysconfig
import time
from collections.abc import Sequence
from pathlib import Path

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


def timed(work, repeat: int = 1) -> tuple[float, object]:
    """The least CPU seconds of all threads over ``repeat`` runs (the machine is shared), and the
    last run's result."""
    best = float("inf")
    result = None
    for _ in range(repeat):
        started = time.process_time()
        result = work()
        best = min(best, time.process_time() - started)
    return best, result


def stdlib_documents(count: int, count_tokens) -> list[str]:
    """The standard library's module sources of 2,000 to 20,000 tokens, by name, at most ``count``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [path.read_text(encoding="utf-8", errors="replace") for path in sorted(root.glob("*.py"))]
    return [text for text, tokens in zip(texts, count_tokens(texts), strict=True)
            if 2_000 <= tokens <= 20_000][:count]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=200)
    parser.add_argument("--corpus", choices=("prose", "stdlib"), default="prose")
    parser.add_argument("--batch", type=int, default=64, help="documents per chunk_batch call")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--overlaps", default="0,32", help="comma-separated overlap_tokens values")
    parser.add_argument("--threads", type=int, default=1, help="RAYON_NUM_THREADS for the tokenizer")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the fastest is shown")
    parser.add_argument("--rule", choices=("hf", "hashing"), default="hf")
    parser.add_argument("--tokenizer", help="a tokenizer.json (default: all-MiniLM-L6-v2's, from its package)")
    parser.add_argument("--seed", type=int, default=24)
    args = parser.parse_args()
    os.environ["RAYON_NUM_THREADS"] = str(args.threads)  # before the tokenizer's thread pool starts

    from teibatch.corpus.chunking import Chunker, ChunkingOptions
    from teibatch.corpus.token_count import ApproxTokenCounter, HFTokenCounter
    from teibatch.corpus.tokenizer_files import find_tokenizer_file

    if args.rule == "hashing":
        def new_counter(by_words: bool = True):
            return ApproxTokenCounter()
        name = "hashing (built-in server)"
    else:
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(find_tokenizer_file("sentence-transformers/all-MiniLM-L6-v2",
                                                                path=args.tokenizer)))

        def new_counter(by_words: bool = True):
            return HFTokenCounter(tokenizer, by_words=by_words)
        name = args.tokenizer or "all-MiniLM-L6-v2"
    whole = new_counter(by_words=False)
    special = whole.special_tokens

    def count_tokens(texts):
        return [n - special for n in whole.counts(texts)]

    if args.corpus == "stdlib":
        documents = stdlib_documents(args.documents, count_tokens)
    else:
        documents = [text for text, _ in long_documents(args.documents, seed=args.seed, count_tokens=count_tokens)]
    batches = [documents[i:i + args.batch] for i in range(0, len(documents), args.batch)]

    base_seconds, offsets = timed(lambda: [o for batch in batches for o in whole.offsets(batch)], args.repeat)
    corpus_tokens = sum(len(o) for o in offsets)
    corpus_chars = sum(len(d) for d in documents)
    corpus_words = sum(len(d.split()) for d in documents)
    base_rate = corpus_tokens / base_seconds
    sizes = [len(o) for o in offsets]
    print(f"rule: {name} ({whole.cuts} cuts), RAYON_NUM_THREADS={args.threads}, max_tokens {args.max_tokens}, "
          f"best of {args.repeat}")
    print(f"corpus ({args.corpus}): {len(documents):,} documents, {corpus_tokens:,} tokens ({min(sizes):,} to "
          f"{max(sizes):,} each), {corpus_chars:,} characters; python {sys.version.split()[0]}")
    header = (f"{'strategy':<17} {'overlap':>7} {'tokens/s/core':>14} {'vs encode':>9} {'chunks':>8} "
              f"{'tok/chunk':>9} {'embedded/corpus':>15} {'recounted':>9} {'encoded':>7}")
    print(header)
    print(f"{'encode_batch':<17} {'-':>7} {base_rate:>14,.0f} {1:>9.2f}")
    if args.rule == "hf":
        fast_seconds, _ = timed(lambda: [whole.counts(batch) for batch in batches], args.repeat)
        rate = corpus_tokens / fast_seconds
        print(f"{'encode_batch_fast':<17} {'-':>7} {rate:>14,.0f} {rate / base_rate:>9.2f}")
    rows = [(strategy, overlap, True) for strategy in ("tokens", "sentences", "paragraphs")
            for overlap in (int(value) for value in args.overlaps.split(","))]
    if args.rule == "hf":
        rows.append(("tokens", 0, False))
    for strategy, overlap, by_words in rows:
        counters: list[CountingCounter] = []

        def run(strategy=strategy, overlap=overlap, by_words=by_words, counters=counters):
            counters.append(CountingCounter(new_counter(by_words)))  # a new, empty word cache each run
            chunker = Chunker(ChunkingOptions(args.max_tokens, overlap, strategy), counters[-1])
            return [d for batch in batches for d in chunker.chunk_batch(batch)]

        seconds, results = timed(run, args.repeat)
        chunks = [chunk for result in results for chunk in result.chunks]
        assert all(chunk.tokens <= args.max_tokens for chunk in chunks)
        embedded = sum(chunk.tokens - special for chunk in chunks)
        rate = corpus_tokens / seconds
        words = getattr(counters[-1].inner, "words", None)
        encoded = f"{words.encoded_words / corpus_words:>7.1%}" if words is not None else f"{'-':>7}"
        label = strategy if by_words or args.rule != "hf" else f"{strategy} (whole)"
        print(f"{label:<17} {overlap:>7} {rate:>14,.0f} {rate / base_rate:>9.2f} "
              f"{len(chunks):>8,} {embedded / len(chunks) + special:>9.1f} {embedded / corpus_tokens:>15.3f} "
              f"{counters[-1].recounted_chars / corpus_chars:>9.1%} {encoded}")
    chunker = Chunker(ChunkingOptions(args.max_tokens * 4, 0, "chars"))
    seconds, results = timed(lambda: [d for batch in batches for d in chunker.chunk_batch(batch)], args.repeat)
    print(f"chars ({args.max_tokens * 4} characters a chunk): {corpus_chars / seconds:,.0f} characters/s/core, "
          f"{sum(len(r.chunks) for r in results):,} chunks")


if __name__ == "__main__":
    main()
