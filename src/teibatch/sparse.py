"""Sparse (SPLADE) vectors as they travel between the TEI client, the senders and the Parquet parts.

A sparse vector is a text's non-zero vocabulary weights: its term ids (``indices``, int32, ascending)
and their weights (``values``, float32). A batch of them is a one-dimensional numpy array of
:class:`SparseVector` objects (``dtype=object``), so that every step that moves dense rows by
position (scattering a request's answer into its texts' places, merging chunks, masking refused
documents, concatenating) moves sparse rows with the same numpy indexing. A row is one Python
object; its values stay in numpy arrays, so nothing loops over values in Python.

Shared by ``tei`` (which decodes them) and ``sink`` (which writes and reads them), like
:mod:`teibatch.endpoint`.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import numpy as np

KIND_AUTO = "auto"
KIND_DENSE = "dense"
KIND_SPARSE = "sparse"
KINDS = (KIND_AUTO, KIND_DENSE, KIND_SPARSE)
"""``model.kind``: ``auto`` gives sparse vectors when the servers serve a SPLADE model, else dense."""


class SparseVector:
    """One text's sparse vector: ``indices`` (int32, strictly ascending) and their ``values`` (float32)."""

    __slots__ = ("indices", "values")

    def __init__(self, indices: np.ndarray, values: np.ndarray) -> None:
        self.indices = indices
        self.values = values

    def __len__(self) -> int:
        return len(self.indices)

    @property
    def nbytes(self) -> int:
        """Bytes its arrays hold (as ``ndarray.nbytes``, so that a store of vectors can count either kind)."""
        return int(self.indices.nbytes + self.values.nbytes)

    def copy(self) -> SparseVector:
        return SparseVector(self.indices.copy(), self.values.copy())

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, SparseVector):
            return NotImplemented
        return bool(np.array_equal(self.indices, other.indices) and np.array_equal(self.values, other.values))

    __hash__ = None  # type: ignore[assignment]  # mutable arrays inside: not hashable

    def __repr__(self) -> str:
        return f"SparseVector({len(self)} non-zero)"

    def __reduce__(self) -> tuple[type[SparseVector], tuple[np.ndarray, np.ndarray]]:
        return SparseVector, (self.indices, self.values)


EMPTY = SparseVector(np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32))


def sparse_rows(count: int) -> np.ndarray:
    """``count`` empty sparse vectors, to be filled by position (the sparse ``np.zeros((count, dim))``)."""
    rows = np.empty(count, dtype=object)
    rows.fill(EMPTY)
    return rows


def vector_rows(count: int, dimension: int, sparse: bool) -> np.ndarray:
    """Room for ``count`` vectors, filled by position: sparse rows, or a float32 matrix."""
    return sparse_rows(count) if sparse else np.zeros((count, dimension), dtype=np.float32)


def split_rows(offsets: np.ndarray, indices: np.ndarray, values: np.ndarray) -> np.ndarray:
    """Flat ``indices``/``values`` cut at ``offsets`` (``rows + 1`` of them) into an array of sparse rows."""
    rows = np.empty(len(offsets) - 1, dtype=object)
    bounds = offsets.tolist()
    for row, (start, end) in enumerate(itertools.pairwise(bounds)):
        rows[row] = SparseVector(indices[start:end], values[start:end])
    return rows


def join_rows(rows: Sequence[SparseVector] | np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The inverse of :func:`split_rows`: ``(offsets int64, indices int32, values float32)`` of ``rows``."""
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter((len(row.indices) for row in rows), dtype=np.int64, count=len(rows)), out=offsets[1:])
    if not len(rows):
        return offsets, np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.float32)
    indices = np.concatenate([row.indices for row in rows]).astype(np.int32, copy=False)
    values = np.concatenate([row.values for row in rows]).astype(np.float32, copy=False)
    return offsets, indices, values


Vector = np.ndarray | SparseVector
"""One row's vector: dense (a float array) or sparse."""


def stack_rows(rows: Sequence[Vector]) -> np.ndarray:
    """Rows of either kind as one batch: a float matrix, or an array of sparse rows."""
    if rows and isinstance(rows[0], SparseVector):
        batch = np.empty(len(rows), dtype=object)
        batch[:] = rows
        return batch
    return np.stack(rows) if rows else np.zeros((0, 0), dtype=np.float32)  # type: ignore[arg-type]
