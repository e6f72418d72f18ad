"""Checks on the vectors a server answered with 200, before anyone stores them.

A 200 is not proof of a right answer: a server restarted with another model answers vectors of
another dimension, a broken GPU or kernel answers NaN, a proxy answers its own HTML page with 200.
:func:`check_vectors` turns each of these into a :class:`~teibatch.errors.ServerFault` naming the
server and the fault, so that no such vector is ever committed: the documents go to another server,
and a server that keeps answering wrongly leaves the pool like a dead one.

The checks cost one pass over the matrix (the squared L2 norms by ``einsum``, which also reveal any
NaN or infinity) plus work on one number per vector; ``docs/client.md`` has the measured cost.
"""

from __future__ import annotations

import numpy as np

from teibatch.errors import ServerFault
from teibatch.sparse import split_rows
from teibatch.tei.decode import SparseBatch

FAULT_WRONG_COUNT = "wrong count"
FAULT_WRONG_DIMENSION = "wrong dimension"
FAULT_NON_FINITE = "non-finite"
FAULT_NOT_NORMALIZED = "not normalized"
FAULT_BAD_BODY = "bad body"
"""The ``kind`` of every :class:`~teibatch.errors.ServerFault` the client raises."""

NORM_TOLERANCE = 1e-2
"""How far from 1 a normalized vector's L2 norm may be.

TEI computes in the model's dtype: float16 by default on GPUs (relative step 2**-11), bfloat16 on the
Python backend (2**-8). Measured on 20,000 random unit vectors of 384 to 4,096 dimensions, the norm
is off 1 by at most 1e-4 once rounded to float16, 6e-4 once rounded to bfloat16, and 8e-4 when the
whole normalization runs in float16 arithmetic. 1e-2 is over 10 times the worst of these, while a
vector that was not normalized at all (raw pooled output: norms from about 3 to several hundred),
a zero vector or a half-garbage one is far outside it."""


def check_vectors(vectors: np.ndarray, *, count: int, dimension: int | None, normalized: bool,
                  server: str) -> np.ndarray:
    """Return ``vectors`` unchanged when they are a right answer to ``count`` inputs; else raise.

    Raises :class:`~teibatch.errors.ServerFault` with ``kind``:

    * ``"wrong count"``: not one vector per input;
    * ``"wrong dimension"``: ``dimension`` is given and the vectors have another one;
    * ``"non-finite"``: a NaN or an infinity in any vector;
    * ``"not normalized"``: ``normalized`` is on and a vector's L2 norm is off 1 by more than
      :data:`NORM_TOLERANCE`;
    * ``"bad body"``: ``vectors`` is not a matrix at all.
    """
    if vectors.ndim != 2:
        raise ServerFault(f"answered an array of shape {vectors.shape}, not one vector per input",
                          server=server, kind=FAULT_BAD_BODY)
    rows, dim = vectors.shape
    if rows != count:
        raise ServerFault(f"answered {rows} vectors for {count} inputs", server=server, kind=FAULT_WRONG_COUNT)
    if dimension is not None and dim != dimension:
        raise ServerFault(f"answered {dim}-dimension vectors, expected {dimension} "
                          "(does it serve another model, or another `dimensions`?)",
                          server=server, kind=FAULT_WRONG_DIMENSION)
    # One pass over the matrix: a NaN or an infinity anywhere in a row makes its sum of squares
    # non-finite, and NaN fails every comparison; so two reductions over one number a row settle
    # the usual case (a right answer), and only a wrong one is looked at more closely.
    squares = np.einsum("ij,ij->i", vectors, vectors)
    low, high = (1 - NORM_TOLERANCE) ** 2, (1 + NORM_TOLERANCE) ** 2
    if rows == 0 or (low <= squares.min() and squares.max() <= high if normalized
                     else np.isfinite(squares.sum())):
        return vectors
    finite = np.isfinite(squares)
    if not finite.all():
        bad = np.flatnonzero(~np.isfinite(vectors[~finite]).all(axis=1))
        if bad.size:
            first = int(np.flatnonzero(~finite)[bad[0]])
            raise ServerFault(f"answered {bad.size} of {rows} vectors with NaN or infinite values "
                              f"(the first for input {first})", server=server, kind=FAULT_NON_FINITE)
        # Only finite values too large to square: far from normalized, but not NaN/Inf.
    if normalized:
        off = np.flatnonzero(~((squares >= low) & (squares <= high)))
        first = int(off[0])
        raise ServerFault(
            f"answered {off.size} of {rows} vectors that are not normalized although normalize is on "
            f"(input {first} has L2 norm {float(np.sqrt(squares[first])):.4g}; allowed 1 ± {NORM_TOLERANCE})",
            server=server, kind=FAULT_NOT_NORMALIZED)
    return vectors


def check_sparse(batch: SparseBatch, *, count: int, vocab_size: int | None, server: str) -> np.ndarray:
    """The rows of a decoded ``/embed_sparse`` answer (:func:`~teibatch.sparse.split_rows`) when it is
    a right answer to ``count`` inputs; else :class:`~teibatch.errors.ServerFault` with ``kind``:

    * ``"wrong count"``: not one sparse vector per input;
    * ``"wrong dimension"``: an index outside ``0 .. vocab_size - 1`` (``vocab_size`` given: the
      servers' probe showed it);
    * ``"non-finite"``: a NaN or an infinite value.
    """
    offsets, indices, values = batch
    rows = len(offsets) - 1
    if rows != count:
        raise ServerFault(f"answered {rows} sparse vectors for {count} inputs", server=server, kind=FAULT_WRONG_COUNT)
    low, high = (int(indices.min()), int(indices.max())) if len(indices) else (0, 0)
    if low < 0 or (vocab_size is not None and high >= vocab_size):
        raise ServerFault(f"answered a sparse vector with index {low if low < 0 else high}, outside the "
                          f"vocabulary of {vocab_size} terms (does it serve another model?)",
                          server=server, kind=FAULT_WRONG_DIMENSION)
    if not np.isfinite(values).all():
        bad = np.flatnonzero(~np.isfinite(values))
        first = int(np.searchsorted(offsets, bad[0], side="right") - 1)
        raise ServerFault(f"answered sparse vectors with {bad.size} NaN or infinite values (the first for input "
                          f"{first})", server=server, kind=FAULT_NON_FINITE)
    return split_rows(offsets, indices.astype(np.int32), values)
