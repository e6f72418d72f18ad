"""A deterministic embedding model that needs no download: signed feature hashing.

Used by default so tests, the quickstart and benchmarks run anywhere, fast, with vectors that
still behave like embeddings: texts that share words are closer than unrelated texts.

Features of a text (lower-cased): its words (``\\w+``) with weight 1, each pair of neighbouring
words with weight 0.7, each character 3-gram of the words joined by single spaces (padded with a
space at both ends) with weight 0.35, and one bias feature with weight 0.3 so no vector is zero.
Each feature's stable 64-bit hash (CRC-32 of the word's UTF-8, mixed with splitmix64; never
Python's salted ``hash()``) picks a coordinate ``(h >> 1) % dimension`` and a sign ``h & 1``.
The vector is the float64 sum of signed weights per coordinate, L2-normalized when asked, then
cast to float32. Sums run in a fixed order per text, so a text gets the same vector bit for bit
whatever else is in its batch, in any process, on any run.
"""

from __future__ import annotations

import re
import zlib

import numpy as np

from teibatch.server.backends.base import SPARSE_VOCAB_SIZE
from teibatch.server.tokens import ApproxTokenizer, Tokenizer

_WORD = re.compile(r"\w+")
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)
_BIGRAM_SALT = np.uint64(0x2545F4914F6CDD1D)
_TRIGRAM_SALT = np.uint64(0x5851F42D4C957F2D)
_BIAS_HASH = 0x1F2E3D4C5B6A7988

WORD_WEIGHT = 1.0
BIGRAM_WEIGHT = 0.7
TRIGRAM_WEIGHT = 0.35
BIAS_WEIGHT = 0.3


def _splitmix(values: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over a uint64 array: spreads every input bit over the whole hash."""
    z = values + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _MIX1
    z = (z ^ (z >> np.uint64(27))) * _MIX2
    return z ^ (z >> np.uint64(31))


def _features(texts: list[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(document index, 64-bit hash, weight) of every feature of every text, grouped per kind."""
    with np.errstate(over="ignore"):
        words_per_text = [_WORD.findall(text.lower()) for text in texts]
        counts = np.fromiter((len(w) for w in words_per_text), dtype=np.int64, count=len(texts))
        flat_words = [w for words in words_per_text for w in words]
        word_hash = _splitmix(np.fromiter((zlib.crc32(w.encode("utf-8", "surrogatepass"))
                                           for w in flat_words), dtype=np.uint64, count=len(flat_words)))
        word_doc = np.repeat(np.arange(len(texts), dtype=np.int64), counts)

        # Bigrams: neighbours inside the same text.
        same = word_doc[1:] == word_doc[:-1]
        bigram_hash = _splitmix(word_hash[:-1][same] * _BIGRAM_SALT ^ word_hash[1:][same])
        bigram_doc = word_doc[1:][same]

        # Character 3-grams of " w1 w2 ... " per text, all texts in one code-point array split by NUL.
        joined = "\0".join(" " + " ".join(words) + " " for words in words_per_text)
        points = np.frombuffer(joined.encode("utf-32-le", "surrogatepass"), dtype=np.uint32).astype(np.uint64)
        is_sep = points == 0
        doc_of_point = np.cumsum(is_sep)
        if len(points) >= 3:
            valid = ~(is_sep[:-2] | is_sep[1:-1] | is_sep[2:])
            grams = (points[:-2] << np.uint64(42)) | (points[1:-1] << np.uint64(21)) | points[2:]
            trigram_hash = _splitmix(grams[valid] ^ _TRIGRAM_SALT)
            trigram_doc = doc_of_point[:-2][valid]
        else:
            trigram_hash = np.zeros(0, dtype=np.uint64)
            trigram_doc = np.zeros(0, dtype=np.int64)

        bias_doc = np.arange(len(texts), dtype=np.int64)
        bias_hash = np.full(len(texts), _BIAS_HASH, dtype=np.uint64)

    docs = np.concatenate([word_doc, bigram_doc, trigram_doc, bias_doc])
    hashes = np.concatenate([word_hash, bigram_hash, trigram_hash, bias_hash])
    weights = np.concatenate([
        np.full(len(word_hash), WORD_WEIGHT), np.full(len(bigram_hash), BIGRAM_WEIGHT),
        np.full(len(trigram_hash), TRIGRAM_WEIGHT), np.full(len(bias_hash), BIAS_WEIGHT),
    ])
    return docs, hashes, weights


class HashingEmbedder:
    """Deterministic, download-free embeddings of any ``dimension``; see the module docstring.

    >>> HashingEmbedder(384).embed(["a cat", "a dog"]).shape
    (2, 384)
    """

    heavy = False

    def __init__(self, dimension: int) -> None:
        if dimension < 1:
            raise ValueError("dimension must be >= 1")
        self.dimension = dimension
        self.tokenizer: Tokenizer = ApproxTokenizer()

    def embed(self, texts: list[str], normalize: bool = True) -> np.ndarray:
        """float32 ``(len(texts), dimension)``; rows have unit L2 norm when ``normalize``."""
        n, dim = len(texts), self.dimension
        if n == 0:
            return np.zeros((0, dim), dtype=np.float32)
        docs, hashes, weights = _features(texts)
        signs = 1.0 - 2.0 * (hashes & np.uint64(1)).astype(np.float64)
        buckets = ((hashes >> np.uint64(1)) % np.uint64(dim)).astype(np.int64)
        sums = np.bincount(docs * dim + buckets, weights=weights * signs, minlength=n * dim)
        vectors = sums.reshape(n, dim)
        if normalize:
            norms = np.sqrt(np.einsum("ij,ij->i", vectors, vectors))
            vectors = vectors / np.maximum(norms, 1e-12)[:, None]
        return vectors.astype(np.float32)

    def embed_sparse(self, texts: list[str]) -> list[tuple[np.ndarray, np.ndarray]]:
        """SPLADE-like weights: ``log1p`` of each feature's summed weight over a 30,522-term vocabulary."""
        if not texts:
            return []
        docs, hashes, weights = _features(texts)
        # The bias feature is left out: a real SPLADE vector has no term every text shares.
        keep = hashes != np.uint64(_BIAS_HASH)
        docs, hashes, weights = docs[keep], hashes[keep], weights[keep]
        terms = ((hashes >> np.uint64(1)) % np.uint64(SPARSE_VOCAB_SIZE)).astype(np.int64)
        sums = np.bincount(docs * SPARSE_VOCAB_SIZE + terms, weights=weights,
                           minlength=len(texts) * SPARSE_VOCAB_SIZE).reshape(len(texts), SPARSE_VOCAB_SIZE)
        result = []
        for row in sums:
            indices = np.flatnonzero(row)
            result.append((indices, np.log1p(row[indices]).astype(np.float32)))
        return result
