"""How an output's float vectors become its stored ``embedding`` values, and how a user quantizes a
query vector the same way.

``output.vector_type`` picks the rule (docs/output.md, "Quantized vectors"):

* ``float32``, ``float16``: the float vector, rounded to the type.
* ``uint8``, ``int8``: per dimension ``d``, with the calibration's ``min[d]`` and ``max[d]`` (the
  smallest and largest value of dimension ``d`` over the calibration sample) and
  ``step[d] = (max[d] - min[d]) / 255``: ``uint8 = floor(clip((x - min[d]) / step[d], 0, 255))`` and
  ``int8 = uint8 - 128``, computed in float64; a dimension with ``max == min`` gives 0 (``-128``).
  The ranges and step are Sentence Transformers' ``quantize_embeddings`` with calibration
  embeddings; values outside the calibration's range are clipped (Sentence Transformers lets them
  wrap around), and ``int8`` is the ``uint8`` code shifted (Sentence Transformers truncates
  ``v - 128`` toward zero, one step higher below the middle).
* ``binary``: one bit per dimension, 1 where ``x > 0``, packed 8 per byte, most significant bit
  first (``numpy.packbits``; Sentence Transformers' ``ubinary``): dimension ``d`` is bit
  ``7 - d % 8`` of byte ``d // 8``; a dimension not a multiple of 8 leaves zero bits at the end.

The calibration is taken once per output, from the first texts of its first run, and kept in its
manifest and every part's metadata: every vector of the output, and every query quantized with
:func:`from_output`, uses the same ranges.

Only numpy here: a user's query code imports this module without Ray or pyarrow.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

FLOAT_TYPES = ("float32", "float16")
CALIBRATED_TYPES = ("int8", "uint8")
VECTOR_TYPES = (*FLOAT_TYPES, *CALIBRATED_TYPES, "binary")
# Texts a first run embeds to calibrate int8/uint8 ranges (fewer when the corpus holds fewer).
DEFAULT_CALIBRATION_TEXTS = 1000
BIT_ORDER: Literal["big"] = "big"  # numpy.packbits' default: dimension 0 is the most significant bit of byte 0
_DTYPES = {"float32": np.float32, "float16": np.float16, "int8": np.int8, "uint8": np.uint8, "binary": np.uint8}


@dataclass(frozen=True)
class Quantization:
    """An output's vector type and, for ``int8``/``uint8``, its calibration: ``minimum`` and ``maximum``
    per dimension, from ``sample`` texts.

    Build one with :meth:`calibrate` (from float vectors), :meth:`from_json` (what a manifest or a
    part's metadata holds) or :func:`from_output`.
    """

    vector_type: str = "float32"
    minimum: tuple[float, ...] | None = None
    maximum: tuple[float, ...] | None = None
    sample: int = 0

    def __post_init__(self) -> None:
        if self.vector_type not in VECTOR_TYPES:
            raise ValueError(f"vector_type must be one of {', '.join(VECTOR_TYPES)}, not {self.vector_type!r}")
        if self.calibrated and (self.minimum is None or self.maximum is None
                                or len(self.minimum) != len(self.maximum)):
            raise ValueError(f"{self.vector_type} needs a calibration: minimum and maximum of one length")

    @property
    def calibrated(self) -> bool:
        """Whether this vector type needs per-dimension ranges (``int8``, ``uint8``)."""
        return self.vector_type in CALIBRATED_TYPES

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy type of one stored value."""
        return np.dtype(_DTYPES[self.vector_type])

    def width(self, dimension: int) -> int:
        """Stored values per vector: the dimension, or ``ceil(dimension / 8)`` bytes for ``binary``."""
        return math.ceil(dimension / 8) if self.vector_type == "binary" else dimension

    @classmethod
    def calibrate(cls, vector_type: str, vectors: np.ndarray) -> Quantization:
        """The quantization of ``vector_type`` with ranges from ``vectors`` (rows of float vectors); only
        ``int8``/``uint8`` keep them. ``vectors`` must hold at least one row for those."""
        if vector_type not in CALIBRATED_TYPES:
            return cls(vector_type)
        values = np.asarray(vectors, dtype=np.float32)
        if values.ndim != 2 or not len(values):
            raise ValueError("a calibration needs at least one vector")
        return cls(vector_type, tuple(float(v) for v in values.min(axis=0)),
                   tuple(float(v) for v in values.max(axis=0)), sample=len(values))

    def quantize(self, vectors: np.ndarray) -> np.ndarray:
        """``vectors`` (rows of float vectors, or one vector) as the output stores them, by the rule in
        the module docstring: the same shape, but ``ceil(dimension / 8)`` bytes per vector for ``binary``."""
        values = np.asarray(vectors)
        if self.vector_type in FLOAT_TYPES:
            return np.ascontiguousarray(values, dtype=self.dtype)
        if self.vector_type == "binary":
            return np.packbits(values > 0, axis=-1, bitorder=BIT_ORDER)
        low, step = self._ranges(values.shape[-1])
        scaled = np.divide(values.astype(np.float64) - low, step, out=np.zeros(values.shape), where=step > 0)
        codes = np.floor(np.clip(scaled, 0.0, 255.0)).astype(np.int16)
        return (codes - 128).astype(np.int8) if self.vector_type == "int8" else codes.astype(np.uint8)

    def dequantize(self, stored: np.ndarray, dimension: int) -> np.ndarray:
        """Float32 vectors that :meth:`quantize` turns back into ``stored``: each code's middle value
        (``min + (code + 0.5) * step``), ``±1`` per bit for ``binary``. The float vectors themselves
        are gone; a reader that needs them writes them too (``output.keep_float``)."""
        values = np.asarray(stored)
        if self.vector_type in FLOAT_TYPES:
            return values.astype(np.float32)
        if self.vector_type == "binary":
            bits = np.unpackbits(values.astype(np.uint8), axis=-1, count=dimension, bitorder=BIT_ORDER)
            return np.where(bits > 0, 1.0, -1.0).astype(np.float32)
        low, step = self._ranges(dimension)
        codes = values.astype(np.float64) + (128 if self.vector_type == "int8" else 0)
        return (low + (codes + 0.5) * step).astype(np.float32)

    def _ranges(self, dimension: int) -> tuple[np.ndarray, np.ndarray]:
        assert self.minimum is not None and self.maximum is not None
        if dimension != len(self.minimum):
            raise ValueError(f"vectors of dimension {dimension}, but the calibration has {len(self.minimum)}")
        low = np.asarray(self.minimum, dtype=np.float64)
        return low, (np.asarray(self.maximum, dtype=np.float64) - low) / 255.0

    def to_json(self) -> dict[str, Any]:
        """What the manifest (``quantization``) and each part's metadata keep."""
        if self.vector_type == "binary":
            return {"vector_type": "binary", "rule": "x > 0, packed 8 per byte", "bit_order": BIT_ORDER}
        if not self.calibrated:
            return {"vector_type": self.vector_type}
        return {"vector_type": self.vector_type, "rule": "floor(clip((x - min) / ((max - min) / 255), 0, 255))"
                + (" - 128" if self.vector_type == "int8" else ""),
                "sample": self.sample, "min": list(self.minimum or ()), "max": list(self.maximum or ())}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Quantization:
        """The quantization :meth:`to_json` wrote."""
        minimum, maximum = data.get("min"), data.get("max")
        return cls(str(data["vector_type"]), tuple(float(v) for v in minimum) if minimum is not None else None,
                   tuple(float(v) for v in maximum) if maximum is not None else None, int(data.get("sample", 0)))


def from_output(path: str, storage_options: Mapping[str, Any] | None = None) -> Quantization:
    """The quantization of the output at ``path`` (a folder or fsspec URL, as ``output.path``), or of
    one of its Parquet parts: quantize query vectors with it to compare them with the stored ones.

    An output written as ``float32`` or ``float16`` gives a quantization that only rounds.
    """
    import fsspec  # here: only this reader needs it

    fs, root = fsspec.core.url_to_fs(path, **dict(storage_options or {}))
    if root.endswith(".parquet"):
        import pyarrow.parquet as pq

        with fs.open(root, "rb") as handle:
            metadata = json.loads((pq.read_schema(handle).metadata or {})[b"teibatch"])
        return Quantization.from_json(metadata.get("quantization", {"vector_type": metadata["vector_type"]}))
    with fs.open(f"{root.rstrip('/')}/_manifest.json", "rb") as handle:
        manifest = json.load(handle)
    stored = manifest.get("quantization")
    if stored is None:
        vector_type = (manifest.get("options") or {}).get("output.vector_type", "float32")
        stored = {"vector_type": vector_type}
    return Quantization.from_json(stored)
