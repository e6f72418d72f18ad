"""HashingEmbedder: shapes, norms, meaning-ish geometry, bit-for-bit determinism, speed."""

from __future__ import annotations

import subprocess
import sys
import time

import numpy as np
import pytest

from teibatch.server.backends.hashing import HashingEmbedder

FOOD, BREAD, STOCK = "A man is eating food.", "A man is eating bread.", "The stock market fell today."


def test_shape_dtype_and_unit_norm() -> None:
    vectors = HashingEmbedder(64).embed(["a cat", "a dog", ""])
    assert vectors.shape == (3, 64) and vectors.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, rtol=1e-6)


def test_unnormalized_vectors_keep_their_length() -> None:
    raw = HashingEmbedder(64).embed(["many words in this text here"], normalize=False)
    assert np.linalg.norm(raw) > 1.5


def test_shared_words_are_closer_than_unrelated_text() -> None:
    food, bread, stock = HashingEmbedder(384).embed([FOOD, BREAD, STOCK])
    assert food @ bread > 0.5
    assert food @ bread > food @ stock + 0.4


def test_vector_does_not_depend_on_the_batch() -> None:
    embedder = HashingEmbedder(384)
    alone = embedder.embed([FOOD])[0]
    in_batch = embedder.embed([STOCK, FOOD, BREAD])[1]
    assert alone.tobytes() == in_batch.tobytes()


def test_same_vector_in_another_process() -> None:
    code = ("import sys; from teibatch.server.backends.hashing import HashingEmbedder; "
            f"sys.stdout.buffer.write(HashingEmbedder(384).embed([{FOOD!r}]).tobytes())")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True, timeout=30).stdout
    assert other == HashingEmbedder(384).embed([FOOD]).tobytes()


def test_sparse_entries_are_sorted_positive_and_in_vocab() -> None:
    (indices, values), = HashingEmbedder(8).embed_sparse(["hello sparse world"])
    assert list(indices) == sorted(indices) and indices.max() < 30522
    assert (values > 0).all()


def test_embeds_thousands_of_short_documents_per_second() -> None:
    texts = [f"document {i} about cats, dogs and the garden they play in" for i in range(5000)]
    start = time.process_time()
    HashingEmbedder(384).embed(texts)
    assert time.process_time() - start < 1.0  # >= 5,000 docs/s with room for a loaded machine


def test_dimension_must_be_positive() -> None:
    with pytest.raises(ValueError, match="dimension must be >= 1"):
        HashingEmbedder(0)
