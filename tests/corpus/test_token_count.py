from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from teibatch.corpus.token_count import CUTS_NONE, CUTS_WHITESPACE, CharCounter, cut_rule, punctuation_cuts

MULTI_BYTE = "naïve café 🙂 日本語のテキスト 한국어 e\u0301 QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw=="


@pytest.mark.parametrize("rule_name", ["minilm", "wordpiece", "bpe", "unigram", "hashing"])
@settings(max_examples=60, deadline=None, derandomize=True)
@given(texts=st.lists(st.one_of(st.text(max_size=80), st.just(MULTI_BYTE)), min_size=1, max_size=6))
def test_counts_are_the_servers_and_offsets_are_characters(token_rules, rule_name: str, texts: list[str]) -> None:
    rule = token_rules[rule_name]
    assert rule.counter.counts(texts) == [rule.server_count(text) for text in texts]  # batched or not
    for text, offsets in zip(texts, rule.counter.offsets(texts), strict=True):
        assert len(offsets) == rule.server_count(text) - rule.counter.special_tokens
        for start, end in offsets:
            assert 0 <= start <= end <= len(text)  # offsets into the str, not its UTF-8 bytes


def test_multi_byte_offsets_point_at_the_characters(token_rules) -> None:
    text = "naïve café 🙂 日本"
    offsets = token_rules["minilm"].counter.offsets([text])[0]
    assert [text[start:end] for start, end in offsets] == ["naïve", "café", "🙂", "日", "本"]
    pieces = token_rules["hashing"].counter.offsets([text])[0]
    assert [text[start:end] for start, end in pieces] == ["na", "ï", "ve", "caf", "é", "🙂", "日", "本"]


def test_special_tokens_count(token_rules) -> None:
    assert [token_rules[name].counter.special_tokens for name in ("minilm", "bpe", "unigram", "hashing")] \
        == [2, 2, 2, 2]
    assert CharCounter().special_tokens == 0


def test_chars_count_characters() -> None:
    counter = CharCounter()
    assert counter.counts(["日本語", ""]) == [3, 0]
    assert counter.offsets(["a🙂"]) == [[(0, 1), (1, 2)]]


BERT = {"model": {"type": "WordPiece"}, "normalizer": {"type": "BertNormalizer"},
        "pre_tokenizer": {"type": "BertPreTokenizer"}, "post_processor": {"type": "TemplateProcessing"}}


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param({}, CUTS_WHITESPACE, id="bert"),
    pytest.param({"normalizer": None, "post_processor": None}, CUTS_WHITESPACE, id="bare-wordpiece"),
    pytest.param({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Punctuation"}]}}, CUTS_WHITESPACE, id="sequence"),
    pytest.param({"pre_tokenizer": {"type": "ByteLevel"}}, CUTS_NONE, id="byte-level"),
    pytest.param({"pre_tokenizer": {"type": "Metaspace"}}, CUTS_NONE, id="metaspace"),
    pytest.param({"pre_tokenizer": None}, CUTS_NONE, id="no-pre-tokenizer"),
    pytest.param({"pre_tokenizer": {"type": "Punctuation"}}, CUTS_NONE, id="no-whitespace-split"),
    pytest.param({"normalizer": {"type": "NFKC"}}, CUTS_NONE, id="nfkc"),
    pytest.param({"normalizer": {"type": "Sequence", "normalizers": [
        {"type": "NFD"}, {"type": "Replace"}]}}, CUTS_NONE, id="replace"),
    pytest.param({"model": {"type": "BPE", "dropout": 0.1}}, CUTS_NONE, id="bpe-dropout"),
    pytest.param({"post_processor": {"type": "ByteLevel"}}, CUTS_NONE, id="other-post-processor"),
    pytest.param({"added_tokens": [{"content": "<new line>"}]}, CUTS_NONE, id="added-token-with-space"),
])
def test_cut_rule_promises_only_what_it_knows(change: dict[str, object], expected: str) -> None:
    assert cut_rule({**BERT, **change}) == expected


ADDED = [{"content": "[CLS]", "normalized": False}, {"content": "[MASK]", "normalized": False}]


@pytest.mark.parametrize(("change", "expected"), [
    pytest.param({"added_tokens": ADDED}, ["[CLS]", "[MASK]"], id="bert"),
    pytest.param({}, [], id="no-added-tokens"),
    pytest.param({"added_tokens": [*ADDED, {"content": "hello", "normalized": True}]}, ["[CLS]", "[MASK]", "hello"],
                 id="normalized-word"),
    pytest.param({"added_tokens": [{"content": "<a.b>", "normalized": True}]}, None, id="normalized-punctuation"),
    pytest.param({"added_tokens": [{"content": "<a.b>"}]}, None, id="normalized-by-default"),
    pytest.param({"pre_tokenizer": {"type": "Whitespace"}}, None, id="whitespace-groups-punctuation"),
    pytest.param({"pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, {"type": "Punctuation"}]}}, None, id="sequence"),
])
def test_punctuation_cuts_only_for_berts_pre_tokenizer(change: dict[str, object], expected: list[str] | None) -> None:
    assert punctuation_cuts({**BERT, **change}) == expected
