"""The quantization rule: int8/uint8 from calibrated ranges, binary sign bits, and the query helper."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pytest

from teibatch.quantize import Quantization, from_output
from teibatch.sink import OutputStore, VectorSchema, WriteOptions, vectors_table, write_part


def reference_uint8(vectors: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """The documented rule, written out: floor(clip((x - min) / ((max - min) / 255), 0, 255)); 0 where max == min."""
    codes = np.zeros(vectors.shape, dtype=np.uint8)
    for d in range(vectors.shape[1]):
        step = (float(high[d]) - float(low[d])) / 255
        for row in range(vectors.shape[0]):
            if step > 0:
                scaled = (float(vectors[row, d]) - float(low[d])) / step
                codes[row, d] = int(np.floor(min(255.0, max(0.0, scaled))))
    return codes


def reference_binary(vectors: np.ndarray) -> np.ndarray:
    """One bit per dimension (x > 0), dimension d at bit 7 - d % 8 of byte d // 8."""
    packed = np.zeros((vectors.shape[0], -(-vectors.shape[1] // 8)), dtype=np.uint8)
    for row in range(vectors.shape[0]):
        for d in range(vectors.shape[1]):
            if vectors[row, d] > 0:
                packed[row, d // 8] |= 1 << (7 - d % 8)
    return packed


@pytest.fixture
def sample() -> np.ndarray:
    rng = np.random.default_rng(7)
    vectors = rng.normal(size=(50, 12)).astype(np.float32)
    vectors[:, 5] = 0.25  # a constant dimension: max == min
    return vectors


def test_calibration_is_each_dimensions_min_and_max(sample: np.ndarray) -> None:
    q = Quantization.calibrate("int8", sample)
    assert q.minimum == tuple(float(v) for v in sample.min(axis=0))
    assert q.maximum == tuple(float(v) for v in sample.max(axis=0))
    assert q.sample == 50


@pytest.mark.parametrize("vector_type", [pytest.param("uint8", id="uint8"), pytest.param("int8", id="int8")])
def test_scalar_codes_equal_the_reference_rule_and_clip_outside_the_range(sample: np.ndarray,
                                                                          vector_type: str) -> None:
    q = Quantization.calibrate(vector_type, sample[:30])
    beyond = np.concatenate([sample, sample[:3] * 4, -sample[:3] * 4])  # far outside the calibrated ranges
    expected = reference_uint8(beyond, sample[:30].min(axis=0), sample[:30].max(axis=0))
    codes = q.quantize(beyond)
    if vector_type == "int8":
        assert codes.dtype == np.int8
        np.testing.assert_array_equal(codes.astype(np.int16), expected.astype(np.int16) - 128)
    else:
        assert codes.dtype == np.uint8
        np.testing.assert_array_equal(codes, expected)
    assert codes[:30].min() == (-128 if vector_type == "int8" else 0)  # each minimum is the lowest code
    assert codes[:30].max() == (127 if vector_type == "int8" else 255)  # each maximum the highest
    assert (codes[:, 5] == codes.min()).all()  # a constant dimension gives the lowest code


def test_binary_packs_sign_bits_most_significant_first() -> None:
    vectors = np.array([[1, -1, 0, 2, -3, 0.5, -0.1, 0.2, 3, -1], [-1] * 10], dtype=np.float32)
    packed = Quantization("binary").quantize(vectors)
    np.testing.assert_array_equal(packed, reference_binary(vectors))
    assert packed.tolist() == [[0b10010101, 0b10000000], [0, 0]]  # 10 dimensions: 2 bytes, zero-padded
    assert Quantization("binary").width(10) == 2


@pytest.mark.parametrize("vector_type", ["int8", "uint8", "binary", "float16"])
def test_dequantized_vectors_quantize_back_to_the_same_codes(sample: np.ndarray, vector_type: str) -> None:
    q = Quantization.calibrate(vector_type, sample)
    codes = q.quantize(sample)
    back = q.dequantize(codes, sample.shape[1])
    assert back.dtype == np.float32 and back.shape == sample.shape
    np.testing.assert_array_equal(q.quantize(back), codes)


def test_json_round_trip_keeps_the_calibration_exactly(sample: np.ndarray) -> None:
    q = Quantization.calibrate("uint8", sample)
    again = Quantization.from_json(orjson.loads(orjson.dumps(q.to_json())))
    assert again == q
    np.testing.assert_array_equal(again.quantize(sample), q.quantize(sample))


def test_a_calibrated_type_without_ranges_is_refused() -> None:
    with pytest.raises(ValueError, match="needs a calibration"):
        Quantization("int8")
    with pytest.raises(ValueError, match="vector_type must be one of"):
        Quantization("int4")


def test_from_output_reads_the_manifest_and_a_part(tmp_path: Path, sample: np.ndarray) -> None:
    q = Quantization.calibrate("int8", sample)
    (tmp_path / "_manifest.json").write_bytes(orjson.dumps({"quantization": q.to_json()}))
    store = OutputStore(str(tmp_path))
    schema = VectorSchema(dimension=12, vector_type="int8", quantization=q)
    table = vectors_table(schema, [f"d{i}" for i in range(50)], sample, ["h"] * 50, {})
    relative = write_part(store, "vectors", "s1", table, WriteOptions())
    assert from_output(str(tmp_path)) == q
    assert from_output(str(tmp_path / relative)) == q
    stored = np.array(table.column("embedding").to_pylist(), dtype=np.int8)
    np.testing.assert_array_equal(from_output(str(tmp_path)).quantize(sample), stored)


def test_from_output_of_a_float_output_only_rounds(tmp_path: Path) -> None:
    (tmp_path / "_manifest.json").write_bytes(orjson.dumps({"options": {"output.vector_type": "float16"}}))
    q = from_output(str(tmp_path))
    assert q.vector_type == "float16"
    assert q.quantize(np.array([[0.1, 0.2]], dtype=np.float32)).dtype == np.float16
