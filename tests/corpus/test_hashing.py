from __future__ import annotations

import re
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from teibatch.corpus import content_hash, content_hasher

OPTIONS = {"model": "BAAI/bge-small-en-v1.5", "normalize": True, "truncate": True, "prompt_name": None,
           "dimensions": None}


def test_shape_and_equality() -> None:
    digest = content_hash("hello", OPTIONS)
    assert re.fullmatch(r"[0-9a-f]{32}", digest)
    assert content_hash("hello", dict(reversed(list(OPTIONS.items())))) == digest
    assert content_hash("hello!", OPTIONS) != digest


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"model": "BAAI/bge-base-en-v1.5"}, id="model"),
        pytest.param({"normalize": False}, id="normalize"),
        pytest.param({"prompt_name": "query"}, id="prompt"),
        pytest.param({"dimensions": 256}, id="dimensions"),
        pytest.param({"revision": "abc"}, id="new-key"),
    ],
)
def test_any_option_change_changes_every_hash(change: dict[str, object]) -> None:
    texts = ["a", "b", "", "a longer text\nwith lines"]
    changed = {**OPTIONS, **change}
    assert all(content_hash(t, OPTIONS) != content_hash(t, changed) for t in texts)


def test_text_and_options_cannot_be_confused() -> None:
    assert content_hash("x", {"a": "b"}) != content_hash("", {"a": "bx"})
    assert content_hash("\ud800 lone surrogate", {}) != content_hash("? lone surrogate", {})


def test_fast_enough_for_every_document() -> None:
    text = "word " * 200
    started = time.perf_counter()
    for _ in range(20_000):
        content_hash(text, OPTIONS)
    assert time.perf_counter() - started < 2.0


@given(st.lists(st.text(), max_size=5))
def test_a_hasher_of_fixed_options_gives_content_hash(texts: list[str]) -> None:
    hash_text = content_hasher(OPTIONS)
    assert [hash_text(t) for t in texts] == [content_hash(t, OPTIONS) for t in texts]
    assert hash_text("\ud800 lone surrogate") == content_hash("\ud800 lone surrogate", OPTIONS)
