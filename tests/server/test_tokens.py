"""The token-count approximation: counts, truncation edges, reversible ids, byte offsets."""

from __future__ import annotations

import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teibatch.server.tokens import ApproxTokenizer

TOK = ApproxTokenizer()


@pytest.mark.parametrize("text, count", [
    pytest.param("", 2, id="empty-has-specials"),
    pytest.param("hello world", 6, id="long-word-split-every-4"),
    pytest.param("a cat sat.", 6, id="punctuation-is-a-token"),
    pytest.param("café", 4, id="non-ascii-char-alone"),
    pytest.param("  spaced\n\tout  ", 5, id="whitespace-free"),
])
def test_count(text: str, count: int) -> None:
    assert TOK.count(text) == count


# Every kind of character the rule tells apart: ASCII word characters, every whitespace ``str.isspace``
# knows (NEL, NBSP, the U+2000 spaces, ideographic space, the ASCII separators), punctuation, letters
# beyond ASCII, U+007F, a lone surrogate, and anything else.
_SPACES = [chr(code) for code in range(sys.maxunicode + 1) if chr(code).isspace()]
_CHARACTERS = st.one_of(st.sampled_from([*"aZ09_", *_SPACES, *".-,'\x7f\x00", "é", "日", "\ud800", "\U0001f600"]),
                        st.characters())


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(_CHARACTERS, max_size=40), max_size=12))
def test_counts_of_many_texts_are_each_text_s_count(texts: list[str]) -> None:
    assert TOK.counts(texts) == [TOK.count(text) for text in texts]


def test_counts_of_a_request_s_inputs() -> None:
    texts = ["hello world", "", "  spaced\n\tout  ", "café au lait", "abcdefghijklm", "a\u3000b\u2003c", "x" * 9]
    assert TOK.counts(texts) == [6, 2, 5, 6, 6, 5, 5]


@pytest.mark.parametrize("direction, expected", [
    pytest.param("right", "one two", id="right-keeps-start"),
    pytest.param("left", "four five", id="left-keeps-end"),
])
def test_truncate_cuts_at_token_edges(direction: str, expected: str) -> None:
    cut = TOK.truncate("one two three four five", 4, direction)
    assert cut == expected
    assert TOK.count(cut) == 4


def test_truncate_leaves_short_text_alone() -> None:
    assert TOK.truncate("short", 10, "right") == "short"
    assert TOK.truncate("short", 10, "left") == "short"


def test_encode_gives_specials_ids_and_byte_offsets() -> None:
    tokens = TOK.encode("né!")
    assert [(t.text, t.special, t.start, t.stop) for t in tokens] == [
        ("[CLS]", True, None, None), ("n", False, 0, 1), ("é", False, 1, 3), ("!", False, 3, 4),
        ("[SEP]", True, None, None)]
    assert tokens[0].id == 101 and tokens[-1].id == 102
    assert len(TOK.encode("né!", add_special_tokens=False)) == 3


@pytest.mark.parametrize("text, decoded", [
    pytest.param("Hello, wonderful world!", "Hello, wonderful world!", id="ascii"),
    pytest.param("naïve  café\n1234567", "naïve café 1234567", id="whitespace-collapsed"),
])
def test_decode_inverts_encode(text: str, decoded: str) -> None:
    ids = [t.id for t in TOK.encode(text)]
    assert TOK.decode(ids) == decoded
    assert TOK.decode(ids, skip_special_tokens=False) == f"[CLS] {decoded} [SEP]"


def test_unknown_ids_decode_as_unk() -> None:
    assert TOK.decode([5, 500]) == "[UNK] [UNK]"
