"""A corpus of long documents for the chunking benchmarks: N documents of 2,000 to 20,000 tokens each.

Each document is paragraphs of 2-8 sentences: English prose from the Python documentation's help
topics (``pydoc_data``, shipped with the interpreter), with about one sentence in twenty in another
script (accents, Cyrillic, Greek, CJK, emoji). Its length is drawn uniformly from the token range
and counted by the built-in server's ``hashing`` rule (``teibatch.server.tokens``), special tokens
left out; sentences are joined by whitespace, which that rule never counts, so the sum of the
sentences' tokens is the document's exactly. The same seed gives the same corpus on the same Python.

    python benchmarks/long_corpus.py long.jsonl                       # 2,000 documents
    python benchmarks/long_corpus.py long.jsonl --documents 200 --max-tokens 5000

Writes one JSON line per document, ``{"id", "title", "text"}``, and prints the documents and their
total tokens. Other benchmark scripts import :func:`long_documents` or :func:`write_long_corpus`.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import orjson

DEFAULT_DOCUMENTS = 2_000
DEFAULT_MIN_TOKENS = 2_000
DEFAULT_MAX_TOKENS = 20_000
DEFAULT_SEED = 24
NON_ASCII_SHARE = 0.05
MAX_SENTENCE_TOKENS = 400
"""Longer "sentences" of the topics (code listings, grammar tables) are left out: prose only."""

NON_ASCII_SENTENCES = (
    "Le café était fermé, mais la boulangerie à côté vendait des croissants encore tièdes.",
    "Über die Brücke gingen täglich Tausende, ohne die Schönheit des Flusses zu bemerken.",
    "El niño pidió una canción más antes de dormir, y su abuela sonrió.",
    "Москва — столица России и крупнейший по численности населения город страны.",
    "Η γλώσσα προγραμματισμού Python δημιουργήθηκε από τον Guido van Rossum.",
    "東京は日本の首都であり、世界でも有数の大都市です。",
    "这个函数返回一个新的列表，其中包含所有满足条件的元素。",
    "서울은 대한민국의 수도이며 한강이 도시를 가로질러 흐릅니다.",
    "The release notes 🎉 list every change, and the team 👩‍💻👨‍💻 thanks its contributors 🙏.",
    "Naïve façades, coöperation and résumés: words English borrowed with their accents intact.",
    "Temperature ranged from −5 °C to 12 °C; the error was ±0.3 µm, roughly ¼ of the tolerance.",
    "Zürich, São Paulo, Kraków and Reykjavík all hosted the conference at least once.",
)


def prose_sentences() -> list[str]:
    """Sentences of English prose from the Python documentation's topics, whitespace made single
    (grammar rules and fragments of fewer than three words left out)."""
    from pydoc_data.topics import topics

    from teibatch.corpus.text_units import split_sentences

    text = "\n\n".join(topics[name] for name in sorted(topics))
    sentences = (" ".join(text[start:end].split()) for start, end in split_sentences(text))
    return [sentence for sentence in sentences if sentence.count(" ") >= 2 and "::=" not in sentence]  # no grammar


def hashing_tokens(texts: Sequence[str]) -> list[int]:
    """Tokens of each text by the built-in server's ``hashing`` rule, special tokens left out."""
    from teibatch.server.tokens import ApproxTokenizer

    rule = ApproxTokenizer()
    return [len(rule.spans(text)) for text in texts]


def long_documents(count: int, *, seed: int = DEFAULT_SEED, min_tokens: int = DEFAULT_MIN_TOKENS,
                   max_tokens: int = DEFAULT_MAX_TOKENS,
                   count_tokens: Callable[[Sequence[str]], list[int]] = hashing_tokens,
                   non_ascii: float = NON_ASCII_SHARE) -> Iterator[tuple[str, int]]:
    """``count`` documents and their tokens (by ``count_tokens``, which must add up over whitespace):
    each between ``min_tokens`` and ``max_tokens``, its length drawn uniformly between them."""
    pool = prose_sentences()
    sizes = count_tokens(pool)
    kept = [i for i, size in enumerate(sizes) if 0 < size <= MAX_SENTENCE_TOKENS]
    sentences, sizes = [pool[i] for i in kept], [sizes[i] for i in kept]
    extra = list(NON_ASCII_SENTENCES)
    extra_sizes = count_tokens(extra)
    longest = max(sizes + extra_sizes)
    if max_tokens - min_tokens < longest:
        raise ValueError(f"max_tokens - min_tokens must be at least the longest sentence's {longest} tokens")
    rng = random.Random(seed)
    for _ in range(count):
        target = rng.randint(min_tokens, max_tokens)
        paragraphs: list[str] = []
        tokens = 0
        while tokens < target:
            paragraph = []
            for _ in range(rng.randint(2, 8)):
                if rng.random() < non_ascii:
                    k = rng.randrange(len(extra))
                    sentence, size = extra[k], extra_sizes[k]
                else:
                    k = rng.randrange(len(sentences))
                    sentence, size = sentences[k], sizes[k]
                if tokens + size > max_tokens:  # only once tokens >= max - longest >= min_tokens
                    target = tokens
                    break
                paragraph.append(sentence)
                tokens += size
            if paragraph:
                paragraphs.append(" ".join(paragraph))
        yield "\n\n".join(paragraphs), tokens


@dataclass(frozen=True)
class LongCorpus:
    """What :func:`write_long_corpus` wrote."""

    path: Path
    documents: int
    tokens: int
    min_tokens: int
    max_tokens: int
    bytes: int

    def __str__(self) -> str:
        return (f"{self.documents:,} documents, {self.tokens:,} tokens ({self.min_tokens:,} to {self.max_tokens:,} "
                f"each, hashing rule), {self.bytes:,} bytes: {self.path}")


def write_long_corpus(path: Path, documents: int = DEFAULT_DOCUMENTS, *, seed: int = DEFAULT_SEED,
                      min_tokens: int = DEFAULT_MIN_TOKENS, max_tokens: int = DEFAULT_MAX_TOKENS) -> LongCorpus:
    """Write :func:`long_documents` to ``path`` as JSON lines ``{"id", "title", "text"}``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    counts = []
    with open(path, "wb") as handle:
        generated = long_documents(documents, seed=seed, min_tokens=min_tokens, max_tokens=max_tokens)
        for i, (text, tokens) in enumerate(generated):
            title = text[:60].rsplit(" ", 1)[0] if len(text) > 60 else text  # its first words
            handle.write(orjson.dumps({"id": f"long-{i:05d}", "title": title, "text": text}) + b"\n")
            counts.append(tokens)
    return LongCorpus(path, len(counts), sum(counts), min(counts, default=0), max(counts, default=0),
                      path.stat().st_size)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("path", type=Path, help="the JSON lines file to write")
    parser.add_argument("--documents", type=int, default=DEFAULT_DOCUMENTS)
    parser.add_argument("--min-tokens", type=int, default=DEFAULT_MIN_TOKENS)
    parser.add_argument("--max-tokens", type=int, default=DEFAULT_MAX_TOKENS)
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = parser.parse_args()
    print(write_long_corpus(args.path, args.documents, seed=args.seed, min_tokens=args.min_tokens,
                            max_tokens=args.max_tokens))


if __name__ == "__main__":
    main()
