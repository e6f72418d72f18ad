"""The one interface every embedding backend of the server implements.

A backend turns texts into vectors and owns the tokenizer that limits and ``usage`` count with.
The server calls it from one batching task at a time, with texts already prompted and truncated,
so a backend needs no locking and no knowledge of HTTP. ``heavy`` backends are called in a worker
thread so the event loop keeps answering ``/health`` and ``/metrics`` while a batch runs.
"""

from __future__ import annotations

from typing import Protocol

import numpy as np

from teibatch.server.tokens import Tokenizer

SPARSE_VOCAB_SIZE = 30522
"""Index range of ``/embed_sparse`` entries (BERT's vocabulary size, like a SPLADE model's)."""


class Backend(Protocol):
    """Embeds texts; ``dimension`` is the vector length, ``tokenizer`` the count used for limits."""

    dimension: int
    tokenizer: Tokenizer
    heavy: bool

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        """A float32 array of shape ``(len(texts), dimension)``, rows L2-normalized when asked."""
        ...

    def embed_sparse(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """Per text, the (indices, values) of its non-zero SPLADE-like weights, indices ascending."""
        ...


def pair_logits(backend: Backend, pairs: list[tuple[str, str]]) -> np.ndarray:
    """Relevance logits of (query, text) pairs, from the cosine of their vectors.

    The reranker mode of any backend: ``logit = 10 * (cos - 0.3)``, so a text sharing words with
    its query scores above 0.5 after the sigmoid and an unrelated one below. Each distinct string
    is embedded once.
    """
    if not pairs:
        return np.zeros(0, dtype=np.float32)
    strings = list(dict.fromkeys(s for pair in pairs for s in pair))
    position = {s: i for i, s in enumerate(strings)}
    vectors = backend.embed(strings, normalize=True).astype(np.float64)
    queries = vectors[[position[q] for q, _ in pairs]]
    texts = vectors[[position[t] for _, t in pairs]]
    cosines = np.einsum("ij,ij->i", queries, texts)
    return (10.0 * (cosines - 0.3)).astype(np.float32)


def sigmoid(logits: np.ndarray) -> np.ndarray:
    """The score TEI reports when ``raw_scores`` is false."""
    return (1.0 / (1.0 + np.exp(-logits.astype(np.float64)))).astype(np.float32)
