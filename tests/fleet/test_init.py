"""The public surface of teibatch.fleet: re-exports only, sorted."""

from __future__ import annotations

import teibatch.fleet


def test_all_is_sorted_and_importable() -> None:
    names = teibatch.fleet.__all__
    assert names == sorted(names)
    assert all(hasattr(teibatch.fleet, name) for name in names)
