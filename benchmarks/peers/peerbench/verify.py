"""Count what a contestant's output holds: documents embedded, wrong, failed, lost.

Every vector is checked against the one the built-in server computes for that document (its
hashing model is deterministic: the text truncated to 512 tokens, then hashed), so a vector written
under the wrong id — a shifted batch — counts as wrong, not as embedded. teibatch also writes the
documents it refused, with the reason, under ``rejects/``: those count as *failed* (reported), any
document neither embedded nor reported counts as *lost*.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq

from peerbench.corpus import read_documents
from teibatch.server.backends.hashing import HashingEmbedder
from teibatch.server.tokens import ApproxTokenizer

MAX_INPUT_LENGTH = 512
MIN_COSINE = 0.999


@dataclass
class Expected:
    """The vector each good document should get; the ids of the bad ones."""

    vectors: dict[str, np.ndarray]
    bad: set[str]
    texts: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, corpus: Path, dimension: int) -> Expected:
        ids, texts = read_documents(corpus)
        tokenizer = ApproxTokenizer()
        good = [(i, t) for i, t in zip(ids, texts, strict=True) if isinstance(t, str) and t]
        truncated = [tokenizer.truncate(t, MAX_INPUT_LENGTH, "right") for _, t in good]
        matrix = HashingEmbedder(dimension).embed(truncated) if good else np.zeros((0, dimension), np.float32)
        return cls({i: matrix[k] for k, (i, _) in enumerate(good)}, set(ids) - {i for i, _ in good},
                   {i: t for i, t in good})


@dataclass
class Counts:
    embedded: int = 0     # good documents with a right vector
    wrong: int = 0        # documents with a vector that is not theirs (or has the wrong shape)
    failed: int = 0       # documents the contestant reported as refused
    lost: int = 0         # documents neither embedded nor reported
    duplicates: int = 0   # ids written more than once
    extra: int = 0        # rows whose id is not in the corpus

    def to_json(self) -> dict[str, Any]:
        return self.__dict__.copy()


def _rows(folder: Path) -> list[tuple[str, Any]]:
    rows: list[tuple[str, Any]] = []
    for path in sorted(folder.rglob("*.parquet")) if folder.exists() else []:
        table = pq.read_table(path)
        if "id" not in table.column_names:
            continue
        ids = table.column("id").to_pylist()
        vectors = table.column("embedding").to_pylist() if "embedding" in table.column_names else [None] * len(ids)
        rows.extend(zip(ids, vectors, strict=True))
    return rows


def _right(vector: Any, expected: np.ndarray) -> bool:
    try:
        got = np.asarray(vector, dtype=np.float64).reshape(-1)
    except (TypeError, ValueError):
        return False
    if got.shape != expected.shape:
        return False
    denominator = float(np.linalg.norm(got) * np.linalg.norm(expected))
    return denominator > 0 and float(got @ expected) / denominator >= MIN_COSINE


def count(output: Path, expected: Expected) -> Counts:
    """Classify every document of the corpus by what ``output`` holds for it."""
    counts = Counts()
    seen: dict[str, int] = {}
    right: set[str] = set()
    wrong: set[str] = set()
    for doc_id, vector in _rows(output / "vectors"):
        doc_id = str(doc_id)
        seen[doc_id] = seen.get(doc_id, 0) + 1
        if doc_id in expected.vectors and _right(vector, expected.vectors[doc_id]):
            right.add(doc_id)
        elif doc_id in expected.vectors or doc_id in expected.bad:
            wrong.add(doc_id)
        else:
            counts.extra += 1
    failed = {str(doc_id) for doc_id, _ in _rows(output / "rejects")}
    counts.duplicates = sum(n - 1 for n in seen.values() if n > 1)
    for doc_id in [*expected.vectors, *expected.bad]:
        if doc_id in right:
            counts.embedded += 1
        elif doc_id in wrong:
            counts.wrong += 1
        elif doc_id in failed:
            counts.failed += 1
        else:
            counts.lost += 1
    return counts
