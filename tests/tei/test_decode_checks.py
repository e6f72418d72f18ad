"""``check_vectors``: what a right answer is, and the ServerFault kind and message of each wrong one."""

from __future__ import annotations

import numpy as np
import pytest

from teibatch.errors import ServerFault
from teibatch.tei.checks import (
    FAULT_BAD_BODY,
    FAULT_NON_FINITE,
    FAULT_NOT_NORMALIZED,
    FAULT_WRONG_COUNT,
    FAULT_WRONG_DIMENSION,
    NORM_TOLERANCE,
    check_vectors,
)

SERVER = "http://127.0.0.1:8081"


def unit(rows: int, dim: int, *, seed: int = 0) -> np.ndarray:
    vectors = np.random.default_rng(seed).standard_normal((rows, dim)).astype(np.float32)
    return vectors / np.linalg.norm(vectors, axis=1, keepdims=True)


def fault(vectors: np.ndarray, *, count: int = 4, dimension: int | None = 8, normalized: bool = True) -> ServerFault:
    with pytest.raises(ServerFault) as caught:
        check_vectors(vectors, count=count, dimension=dimension, normalized=normalized, server=SERVER)
    assert caught.value.server == SERVER and caught.value.retryable
    return caught.value


def test_a_right_answer_comes_back_as_it_is() -> None:
    vectors = unit(4, 8)
    assert check_vectors(vectors, count=4, dimension=8, normalized=True, server=SERVER) is vectors
    assert check_vectors(vectors * 5, count=4, dimension=None, normalized=False, server=SERVER).shape == (4, 8)


def test_the_messages_say_what_was_answered_and_what_was_expected() -> None:
    assert str(fault(unit(3, 8))) == f"{SERVER}: answered 3 vectors for 4 inputs"
    wrong = fault(unit(4, 256), dimension=384)
    assert str(wrong).startswith(f"{SERVER}: answered 256-dimension vectors, expected 384")
    assert (wrong.kind, fault(unit(3, 8)).kind) == (FAULT_WRONG_DIMENSION, FAULT_WRONG_COUNT)
    assert fault(np.ones(8, dtype=np.float32)).kind == FAULT_BAD_BODY


@pytest.mark.parametrize("value", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("normalized", [True, False])
def test_nan_and_infinity_anywhere_are_faults(value: float, normalized: bool) -> None:
    vectors = unit(4, 8)
    vectors[2, 5] = value
    error = fault(vectors, normalized=normalized)
    assert error.kind == FAULT_NON_FINITE
    assert "1 of 4 vectors with NaN or infinite values (the first for input 2)" in str(error)


def test_huge_finite_values_are_not_called_non_finite() -> None:
    vectors = unit(4, 8)
    vectors[1, 0] = 3e38  # its square overflows float32; the value itself is finite
    assert check_vectors(vectors, count=4, dimension=8, normalized=False, server=SERVER) is vectors
    assert fault(vectors).kind == FAULT_NOT_NORMALIZED


@pytest.mark.parametrize(("norm", "ok"), [
    pytest.param(1 + NORM_TOLERANCE * 0.9, True, id="just-inside-above"),
    pytest.param(1 - NORM_TOLERANCE * 0.9, True, id="just-inside-below"),
    pytest.param(1 + NORM_TOLERANCE * 1.1, False, id="just-outside-above"),
    pytest.param(1 - NORM_TOLERANCE * 1.1, False, id="just-outside-below"),
    pytest.param(0.0, False, id="zero-vector"),
    pytest.param(3.0, False, id="raw"),
])
def test_normalized_means_norm_one_within_the_tolerance(norm: float, ok: bool) -> None:
    vectors = unit(4, 8)
    vectors[3] *= norm
    if ok:
        check_vectors(vectors, count=4, dimension=8, normalized=True, server=SERVER)
    else:
        error = fault(vectors)
        assert error.kind == FAULT_NOT_NORMALIZED
        assert f"1 of 4 vectors that are not normalized although normalize is on (input 3 has L2 norm {norm:.4g}" \
            in str(error)


def test_float16_rounding_of_normalized_vectors_passes() -> None:
    # TEI on a GPU normalizes in float16 by default: its rounding must never look like a fault.
    vectors = unit(2000, 1024).astype(np.float16).astype(np.float32)
    check_vectors(vectors, count=2000, dimension=1024, normalized=True, server=SERVER)
    error = np.abs(np.linalg.norm(vectors, axis=1) - 1).max()
    assert 0 < error < NORM_TOLERANCE / 5
