"""Turning a 200 answer into a float32 matrix, as cheaply as Python allows.

Decoding is the client's main CPU cost (``docs/client.md`` has the numbers):

* ``/embed`` answers JSON floats (about 12 bytes a float). ``orjson`` parses them in C and numpy
  converts the nested lists in one call; measured against ``np.fromstring(sep=",")``, a flat
  ``orjson`` list, and the standard ``json`` module, this was the fastest (about 2× ``json``).
* ``/v1/embeddings`` with ``encoding_format: base64`` answers each vector as base64 of its
  little-endian float32 bytes: ``orjson`` only scans strings, ``binascii`` decodes them, numpy views
  the bytes; about 3× cheaper than the ``/embed`` path.

Anything that is not the expected shape raises :class:`ValueError`; the client maps it to
:class:`~teibatch.errors.TeiUnavailable` (a proxy's HTML page, a cut body).
"""

from __future__ import annotations

import binascii

import numpy as np
import orjson

ROUTE_EMBED = "embed"
ROUTE_OPENAI_BASE64 = "openai-base64"


def decode_vectors(route: str, content: bytes) -> np.ndarray:
    """Vectors from a 200 answer of ``/embed`` (JSON floats) or ``/v1/embeddings`` (base64 float32)."""
    if route == ROUTE_EMBED:
        return decode_embed(content)
    if route == ROUTE_OPENAI_BASE64:
        return decode_base64(content)
    raise ValueError(f"unknown route {route!r}")


def decode_embed(content: bytes) -> np.ndarray:
    """``[[f32, ...], ...]`` → a (rows, dim) float32 matrix."""
    try:
        vectors = np.asarray(orjson.loads(content), dtype=np.float32)
    except (orjson.JSONDecodeError, TypeError) as exc:
        raise ValueError(f"not a JSON list of vectors: {exc}") from exc
    if vectors.ndim != 2:
        raise ValueError(f"expected a list of vectors, got an array of shape {vectors.shape}")
    return vectors


def decode_base64(content: bytes) -> np.ndarray:
    """OpenAI's ``{"data": [{"embedding": "<base64>", "index": i}, ...]}`` → rows in ``index`` order."""
    try:
        rows = orjson.loads(content)["data"]
        rows = sorted(rows, key=lambda row: row["index"])
        raw = b"".join([binascii.a2b_base64(row["embedding"]) for row in rows])
    except (orjson.JSONDecodeError, KeyError, TypeError, binascii.Error) as exc:
        raise ValueError(f"not an OpenAI base64 embeddings answer: {exc}") from exc
    if not rows:
        return np.zeros((0, 0), dtype=np.float32)
    if len(raw) % (4 * len(rows)):
        raise ValueError(f"{len(raw)} bytes do not split into {len(rows)} float32 vectors")
    return np.frombuffer(raw, dtype="<f4").reshape(len(rows), -1).astype(np.float32, copy=False)
