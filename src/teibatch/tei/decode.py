"""Turning a 200 answer into a float32 matrix, as cheaply as Python allows.

Decoding is the client's main CPU cost (``docs/client.md`` has the numbers):

* ``/embed`` answers JSON floats (about 12 bytes a float). ``orjson`` parses them in C and numpy
  converts the nested lists in one call; measured against ``np.fromstring(sep=",")``, a flat
  ``orjson`` list, and the standard ``json`` module, this was the fastest.
* ``/v1/embeddings`` with ``encoding_format: base64`` answers each vector as base64 of its
  little-endian float32 bytes: ``orjson`` only scans strings, ``pybase64`` decodes them, numpy views
  the bytes; cheaper still than the ``/embed`` path.
* ``/embed_sparse`` answers each text's non-zero entries as ``{"index": i, "value": v}`` objects:
  ``orjson`` parses them, and ``itemgetter`` with ``np.fromiter`` take the numbers out in C
  (:func:`decode_sparse`), with no Python statement per entry.

Anything that is not the expected shape raises :class:`ValueError` (a proxy's HTML page, an empty
or cut body, base64 that is not base64, rows of different lengths, missing or repeated ``index``);
the client maps it, at its one boundary, to :class:`~teibatch.errors.ServerFault` ``"bad body"``.
Whether the matrix is a right answer (count, dimension, finite, normalized) is
:func:`teibatch.tei.checks.check_vectors`'s business.
"""

from __future__ import annotations

import binascii
import itertools
import operator

import numpy as np
import orjson
import pybase64

ROUTE_EMBED = "embed"
ROUTE_OPENAI_BASE64 = "openai-base64"
ROUTE_EMBED_SPARSE = "embed_sparse"

_INDEX = operator.itemgetter("index")
_VALUE = operator.itemgetter("value")
_EMBEDDING = operator.itemgetter("embedding")

SparseBatch = tuple[np.ndarray, np.ndarray, np.ndarray]
"""``(offsets, indices, values)``: row ``r``'s entries are ``[offsets[r]:offsets[r + 1]]`` of the flat
``indices`` (int64, ascending within a row) and ``values`` (float32)."""


def decode_vectors(route: str, content: bytes) -> np.ndarray:
    """Vectors from a 200 answer of ``/embed`` (JSON floats) or ``/v1/embeddings`` (base64 float32)."""
    if route == ROUTE_EMBED:
        return decode_embed(content)
    if route == ROUTE_OPENAI_BASE64:
        return decode_base64(content)
    raise ValueError(f"unknown route {route!r}")


def decode_embed(content: bytes) -> np.ndarray:
    """``[[f32, ...], ...]`` → a (rows, dim) float32 matrix; ``[]`` → a (0, 0) one."""
    try:
        vectors = np.asarray(orjson.loads(content), dtype=np.float32)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"not a JSON list of vectors: {exc}") from exc
    if vectors.shape == (0,):
        return np.zeros((0, 0), dtype=np.float32)
    if vectors.ndim != 2:
        raise ValueError(f"expected a list of vectors, got an array of shape {vectors.shape}")
    return vectors


def decode_base64(content: bytes) -> np.ndarray:
    """OpenAI's ``{"data": [{"embedding": "<base64>", "index": i}, ...]}`` → rows in ``index`` order.

    ``pybase64`` decodes (SIMD, several times ``binascii``'s speed) and, with ``validate``, refuses
    any character outside the alphabet and padding anywhere but at the end, so a row decodes to
    exactly the bytes its length says. When rows carry no padding (a 384-d row is 1,536 bytes,
    2,048 characters) they are joined and decoded in one call. Rows of unequal length, or indexes
    other than ``0..n-1``, are refused rather than reshaped into wrong vectors.
    """
    try:
        rows = orjson.loads(content)["data"]
        indexes = list(map(_INDEX, rows))
        if indexes != list(range(len(rows))):  # TEI answers in order; anything else is sorted, then checked
            rows = sorted(rows, key=_INDEX)
            indexes = list(map(_INDEX, rows))
        texts = list(map(_EMBEDDING, rows))
        if not rows:
            return np.zeros((0, 0), dtype=np.float32)
        if indexes != list(range(len(rows))):
            raise ValueError(f"the {len(rows)} rows' indexes are not 0..{len(rows) - 1}")
        width = len(texts[0])
        if any(len(text) != width for text in texts):
            raise ValueError("rows are not base64 of equal-length float32 vectors")
        joined = "".join(texts)
        if width % 4 == 0 and "=" not in joined:
            raw = pybase64.b64decode(joined, validate=True)
        else:
            chunks = [pybase64.b64decode(text, validate=True) for text in texts]
            if any(len(chunk) != len(chunks[0]) for chunk in chunks):
                raise ValueError("rows are not base64 of equal-length float32 vectors")
            raw = b"".join(chunks)
    except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"not an OpenAI base64 embeddings answer: {exc}") from exc
    size = len(raw) // len(rows)
    if size % 4 or size == 0:
        raise ValueError(f"{size} bytes a row is not a whole, non-zero number of float32 values")
    return np.frombuffer(raw, dtype="<f4").reshape(len(rows), -1).astype(np.float32, copy=False)


def decode_sparse(content: bytes) -> SparseBatch:
    """``[[{"index": i, "value": v}, ...], ...]`` → :data:`SparseBatch`, each row sorted by index.

    ``orjson`` parses the body in C; ``operator.itemgetter`` mapped over the entries and
    ``np.fromiter`` take the indices and the values out without a Python statement per entry
    (``docs/client.md`` has the measurements). Rows whose indices are out of order are sorted; an
    index twice in a row, or one that is not a whole number, is refused.
    """
    try:
        rows = orjson.loads(content)
        if not isinstance(rows, list) or not all(isinstance(row, list) for row in rows):
            raise TypeError("not a list of lists")
        entries = list(itertools.chain.from_iterable(rows))
        positions = np.fromiter(map(_INDEX, entries), dtype=np.float64, count=len(entries))
        with np.errstate(over="ignore"):  # a value beyond float32 becomes infinite: the client's check refuses it
            values = np.fromiter(map(_VALUE, entries), dtype=np.float32, count=len(entries))
    except (orjson.JSONDecodeError, TypeError, ValueError, KeyError, OverflowError) as exc:
        raise ValueError(f"not a JSON list of sparse vectors ({{index, value}} lists): {exc}") from exc
    indices = positions.astype(np.int64)
    if not np.array_equal(indices, positions):
        raise ValueError("an index that is not a whole number")
    offsets = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, rows), dtype=np.int64, count=len(rows)), out=offsets[1:])
    # Between two entries of one row the index must grow; a row's first entry follows another row.
    inner = np.ones(max(len(indices) - 1, 0), dtype=bool)
    starts = offsets[1:-1]
    inner[starts[(starts > 0) & (starts < len(indices))] - 1] = False
    if (np.diff(indices)[inner] <= 0).any():
        rows_of = np.repeat(np.arange(len(rows)), np.diff(offsets))
        order = np.lexsort((indices, rows_of))
        indices, values = indices[order], values[order]
        if (np.diff(indices)[inner] == 0).any():
            raise ValueError("the same index twice in one sparse vector")
    return offsets, indices, values
