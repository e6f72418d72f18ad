"""Synthetic corpora for the benchmarks: deterministic texts of a chosen length, written as jsonl."""

from __future__ import annotations

from pathlib import Path

import orjson

VOCABULARY = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet")


def synthetic_text(n: int, words: int, prefix: str = "doc") -> str:
    """Document ``n``: its number, then ``words`` words from a small vocabulary."""
    return f"{prefix} {n} " + " ".join(VOCABULARY[(n * 7 + j * 3) % len(VOCABULARY)] for j in range(words))


def write_jsonl_corpus(root: Path, documents: int, words: int, files: int = 8) -> None:
    """``documents`` records ``{"id", "text"}`` spread over ``files`` jsonl files under ``root``."""
    root.mkdir(parents=True)
    per_file = documents // files
    for f in range(files):
        with open(root / f"part-{f:02d}.jsonl", "wb") as handle:
            for i in range(per_file):
                n = f * per_file + i
                handle.write(orjson.dumps({"id": str(n), "text": synthetic_text(n, words)}) + b"\n")
