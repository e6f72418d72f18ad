from __future__ import annotations

import json
import threading
from bisect import bisect_left
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from teibatch.corpus.chunking import Chunker, ChunkingOptions
from teibatch.corpus.token_count import HFTokenCounter, punctuation_cuts
from teibatch.corpus.word_counts import LONG_WORD_CHARS, SPACE, WordCounter, WordOffsets

WORD_RULES = ("minilm", "wordpiece")  # the rules whose counts add up at whitespace

# Words and separators that try the word path's promise: accents (composed, combining, alone after
# a space), text without spaces (CJK, base64, one long word), emoji (joined, flags), punctuation
# runs, characters the normalizer drops (control, zero-width, U+0085) and whitespace the word path
# does not split at (U+3000, no-break space, vertical tab, U+001C), added tokens, and code (whose
# pieces between ASCII punctuation are counted apart).
WORDS = ["the", "Quick", "naïve", "cafe\u0301", "\u0301", "\u0301accent", "Ǆemo", "İstanbul", "ﬁne", "ß",
         "日本語のテキストです", "中文句子也在这里", "한국어", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw==",
         "antidisestablishmentarianism" * 5, "x" * (LONG_WORD_CHARS + 1), "日本" * 80, "🙂", "👩‍👩‍👧", "🇫🇷🇩🇪",
         "...", "?!?!", "--->", "«»", "(a)", "e.g.", "3.14", "don't", "C++", "foo_bar", "\x00", "\x07bell",
         "\u200b", "zero\u200bwidth", "\ufffd", "[MASK]", "[CLS]x", "a[SEP]b", "\x85", "\u3000", "a\xa0b",
         "\x0b", "x\x1cy", "\U0001d400", "\ud7ff", "self._sock.sendall(data)", "os.path.join(a,b)",
         "x[MASK]y.z", "[MASK].", "a.[CLS]", "[[SEP]]", "«a».b", "x.\u0301y", "_.\x00._", "日本.語"]
SEPARATORS = [" ", " ", " ", "", "\n", "\n\n", "\t", "\r\n", "  ", " \t ", "\u3000", "\x85"]
PROPERTY_SETTINGS = settings(max_examples=120, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

texts = st.one_of(
    st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPARATORS)), max_size=60).map(
        lambda pairs: "".join(word + separator for word, separator in pairs)),
    st.text(max_size=200),
    st.text(alphabet=st.characters(codec="utf-8"), min_size=LONG_WORD_CHARS - 2, max_size=3 * LONG_WORD_CHARS),
)


class RecordingTokenizer:
    """A ``tokenizers.Tokenizer`` that records the texts it was asked to encode, call by call."""

    def __init__(self, tokenizer: Any) -> None:
        self._tok = tokenizer
        self.batches: list[list[str]] = []
        self.singles: list[str] = []

    def encode_batch_fast(self, texts: list[str], add_special_tokens: bool) -> list[Any]:
        self.batches.append(list(texts))
        return self._tok.encode_batch_fast(texts, add_special_tokens=add_special_tokens)

    def encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[Any]:
        self.batches.append(list(texts))
        return self._tok.encode_batch(texts, add_special_tokens=add_special_tokens)

    def encode(self, text: str, add_special_tokens: bool) -> Any:
        self.singles.append(text)
        return self._tok.encode(text, add_special_tokens=add_special_tokens)

    @property
    def encoded(self) -> list[str]:
        return [text for batch in self.batches for text in batch] + self.singles


_plain: dict[str, HFTokenCounter] = {}


def plain(token_rules: Any, name: str) -> HFTokenCounter:
    """The rule's counter that encodes each text whole: what the word path must equal."""
    if name not in _plain:
        _plain[name] = HFTokenCounter(token_rules[name].tokenizer, by_words=False)
    assert _plain[name].words is None
    return _plain[name]


_small: dict[str, HFTokenCounter] = {}


def small(token_rules: Any, name: str) -> HFTokenCounter:
    """The rule's word-path counter with a cache of 64 words, one for all examples: words are
    dropped and counted again as the examples go."""
    if name not in _small:
        _small[name] = HFTokenCounter(token_rules[name].tokenizer, cache_words=64)
    return _small[name]


def words_of(token_rules: Any, name: str, max_words: int = 64, *, pieces: bool = True) -> WordCounter:
    """A word counter over the rule's tokenizer; ``pieces``: counting words not seen by their pieces
    between ASCII punctuation, as HFTokenCounter does for BERT's pre-tokenizer."""
    counter = plain(token_rules, name)
    keep_whole = punctuation_cuts(json.loads(counter._tok.to_str())) if pieces else None
    assert (keep_whole is not None) is pieces
    return WordCounter(counter._tok, max_words, keep_whole)


@pytest.mark.parametrize("pieces", [True, False], ids=["pieces", "words"])
@pytest.mark.parametrize("rule_name", WORD_RULES)
@PROPERTY_SETTINGS
@given(batch=st.lists(texts, min_size=1, max_size=5))
def test_counts_and_offsets_are_the_tokenizers(token_rules, rule_name: str, pieces: bool, batch: list[str]) -> None:
    reference = plain(token_rules, rule_name)
    words = words_of(token_rules, rule_name, max_words=16, pieces=pieces)  # small: words dropped, counted again
    expected = reference.offsets(batch)
    special = reference.special_tokens
    for _ in range(2):  # the second time from the cache
        assert [special + count for count in words.counts(batch)] == reference.counts(batch)
        found = words.offsets(batch)
        assert [list(offsets) for offsets in found] == [list(offsets) for offsets in expected]
        for text, offsets, tokens in zip(batch, found, expected, strict=True):
            assert len(offsets) == len(tokens)
            assert [offsets[j] for j in range(len(tokens))] == list(tokens)
            assert [offsets.first_at(char) for char in range(len(text) + 2)] \
                == [bisect_left(tokens, (char,)) for char in range(len(text) + 2)]
            clean = [0 < j < len(tokens) and tokens[j][0] >= tokens[j - 1][1] for j in range(len(tokens) + 1)]
            assert [offsets.clean(j) for j in range(len(tokens) + 1)] == clean
            assert [offsets.at_space(j) for j in range(len(tokens))] \
                == [clean[j] and tokens[j][0] > 0 and text[tokens[j][0] - 1] in SPACE for j in range(len(tokens))]
    assert words.cached_words <= 16


@pytest.mark.parametrize("strategy", ["tokens", "sentences", "paragraphs"])
@pytest.mark.parametrize("rule_name", WORD_RULES)
@PROPERTY_SETTINGS
@given(batch=st.lists(st.tuples(texts, st.sampled_from(["", "A title\n", "Title: ", "日本\n", "x"])),
                      min_size=1, max_size=4),
       max_tokens=st.sampled_from([8, 12, 20, 40]), overlap=st.sampled_from([0, 0, 3, 5]))
def test_the_chunker_cuts_where_the_plain_path_cuts(token_rules, rule_name: str, strategy: str,
                                                    batch: list[tuple[str, str]], max_tokens: int,
                                                    overlap: int) -> None:
    counter = small(token_rules, rule_name)
    assert counter.words is not None
    options = ChunkingOptions(max_tokens, overlap, strategy)
    documents, prefixes = [text for text, _ in batch], [prefix for _, prefix in batch]
    expected = Chunker(options, plain(token_rules, rule_name)).chunk_batch(documents, prefixes)
    assert Chunker(options, counter).chunk_batch(documents, prefixes) == expected  # every edge and count


def test_a_text_is_read_as_a_sequence(token_rules) -> None:
    text = "naïve café 🙂 日本"
    offsets = words_of(token_rules, "minilm").offsets([text])[0]
    assert isinstance(offsets, WordOffsets)
    assert [text[start:end] for start, end in offsets] == ["naïve", "café", "🙂", "日", "本"]
    assert offsets[-1] == offsets[4] == (14, 15)
    assert offsets[1:3] == [(6, 10), (11, 12)]
    with pytest.raises(IndexError):
        offsets[5]
    assert len(words_of(token_rules, "minilm").offsets([""])[0]) == 0


def test_repeated_words_are_encoded_once_and_offsets_only_where_read(token_rules) -> None:
    recording = RecordingTokenizer(plain(token_rules, "minilm")._tok)
    counter = WordCounter(recording)
    sentence = "the quick brown fox jumps over the lazy dog"
    text = "\n".join([sentence] * 200)
    assert counter.counts([text, sentence]) == [9 * 200, 9]
    assert len(recording.batches) == 1  # one batch for the words not seen ...
    assert sorted(recording.batches[0]) == sorted(set(sentence.split()))  # ... each word once
    offsets = counter.offsets([text])[0]
    assert len(offsets) == 9 * 200 and len(recording.batches) == 1  # all from the cache
    assert offsets[9 * 150 + 1] == (len(sentence) * 150 + 150 + 4, len(sentence) * 150 + 150 + 9)
    assert offsets.first_at(len(sentence) * 3 + 3) == 27
    assert recording.singles == ["quick"]  # only the word read; the edge of a word needs none
    assert counter.encoded_words == len(recording.encoded) == 8 + 1


def test_code_words_not_seen_are_counted_by_their_pieces(token_rules) -> None:
    recording = RecordingTokenizer(plain(token_rules, "minilm")._tok)
    counter = WordCounter(recording, keep_whole=["[MASK]"])
    text = "self.sock.send(data) self.sock.close() x[MASK].y"
    assert counter.counts([text]) == [plain(token_rules, "minilm").counts([text])[0] - 2]
    assert sorted(text for batch in recording.batches for text in batch) \
        == sorted(["self", ".", "sock", "send", "(", "data", ")", "close", "x[MASK].y"])  # an added token: whole
    assert counter.counts(["self.close(data)"]) == [6] and len(recording.batches) == 2  # all pieces known


def test_long_words_are_encoded_with_their_offsets_and_not_kept(token_rules) -> None:
    recording = RecordingTokenizer(plain(token_rules, "minilm")._tok)
    counter = WordCounter(recording)
    blob = "日本語のテキストです" * 30
    offsets = counter.offsets([f"intro {blob} outro"])[0]
    assert offsets[100] == (6 + 99, 6 + 100)  # CJK characters are one token each
    assert recording.singles == []  # the long word's offsets came with its batch
    assert len(recording.batches) == 2 and recording.batches[1] == [blob]
    assert counter.cached_words == 2  # intro, outro


def test_the_cache_is_bounded_and_drops_its_oldest_half(token_rules) -> None:
    counter = words_of(token_rules, "wordpiece", max_words=10, pieces=False)
    first = [f"w{i}" for i in range(10)]
    counter.counts([" ".join(first[:5])])
    counter.counts([" ".join(first[5:])])
    assert counter.cached_words == 10
    expected = plain(token_rules, "wordpiece").counts(["fresh w0 w9"])[0] - 2
    # w0 is in the cache when the call starts and dropped to make room for "fresh": counted again
    assert counter.counts(["fresh w0 w9"]) == [expected]
    assert sorted(counter._counts) == sorted([*first[5:], "fresh"])  # the older half went
    with pytest.raises(ValueError, match="max_words must be at least 1"):
        WordCounter(counter._tok, 0)


def test_threads_sharing_a_small_cache_count_exactly(token_rules) -> None:
    reference = plain(token_rules, "minilm")
    counter = HFTokenCounter(token_rules["minilm"].tokenizer, cache_words=32)
    batches = [[" ".join(f"word{(k * 7 + i) % 97} x{k}" for i in range(40)) for k in range(t, t + 4)]
               for t in range(6)]
    expected = [reference.counts(batch) for batch in batches]
    wrong: list[int] = []

    def work(index: int) -> None:
        for _ in range(20):
            if counter.counts(batches[index]) != expected[index] \
                    or [len(o) for o in counter.offsets(batches[index])] != [n - 2 for n in expected[index]]:
                wrong.append(index)

    threads = [threading.Thread(target=work, args=(index,)) for index in range(len(batches))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not wrong and not any(thread.is_alive() for thread in threads)


@pytest.mark.parametrize(("rule_name", "change", "by_words"), [
    pytest.param("minilm", None, True, id="minilm"),
    pytest.param("wordpiece", None, True, id="wordpiece"),
    pytest.param("bpe", None, False, id="byte-level-bpe"),
    pytest.param("unigram", None, False, id="metaspace-unigram"),
    pytest.param("minilm", "lstrip", False, id="added-token-takes-whitespace"),
])
def test_the_word_path_is_used_only_where_it_is_exact(token_rules, rule_name: str, change: str | None,
                                                      by_words: bool) -> None:
    tokenizer = token_rules[rule_name].tokenizer
    if change is not None:
        from tokenizers import Tokenizer

        config = json.loads(tokenizer.to_str())
        config["added_tokens"][-1][change] = True
        tokenizer = Tokenizer.from_str(json.dumps(config))
    assert (HFTokenCounter(tokenizer).words is not None) is by_words
    assert HFTokenCounter(tokenizer, by_words=False).words is None



def test_offsets_compare_as_the_list_of_other_counters(token_rules) -> None:
    text = "naïve café 🙂"
    found = words_of(token_rules, "minilm").offsets([text])[0]
    listed = plain(token_rules, "minilm").offsets([text])[0]
    assert found == listed and listed == found and [found] == [listed]
    assert found != listed[:-1] and found != "naïve"
