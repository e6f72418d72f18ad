from __future__ import annotations

import ast
from bisect import bisect_left
from collections.abc import Sequence
from itertools import pairwise
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import teibatch.corpus.chunking as chunking
from teibatch.corpus.chunking import (
    STRATEGIES,
    WORD_BACKOFF_TOKENS,
    Chunk,
    Chunker,
    ChunkingOptions,
)
from teibatch.corpus.text_units import split_paragraphs, split_sentences
from teibatch.corpus.token_count import CUTS_NONE, CUTS_TOKENS, CUTS_WHITESPACE

RULES = ("minilm", "wordpiece", "bpe", "unigram", "hashing")
TOKEN_STRATEGIES = ("tokens", "sentences", "paragraphs")

WORDS = ["the", "quick", "brown", "fox", "jumps", "over", "unbelievably", "xylophonist",
         "antidisestablishmentarianism", "Héllo", "naïve", "wörld", "cafe\u0301", "🙂", "👩‍👩‍👧",
         "日本語のテキスト", "中文句子", "한국어", "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw==",
         "3.14", "e.g.", "Dr.", "x", "a", "(", ")", ",", "—", "don't", "C++", "foo_bar", "«quoted»"]
SEPARATORS = [" ", " ", " ", " ", "", "\n", "\n\n", ". ", "! ", "? ", "。", "！", "\t", "  ", ".\n\n"]
PROPERTY_SETTINGS = settings(max_examples=80, deadline=None, derandomize=True,
                             suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

texts = st.one_of(
    st.lists(st.tuples(st.sampled_from(WORDS), st.sampled_from(SEPARATORS)), max_size=150).map(
        lambda pairs: "".join(word + separator for word, separator in pairs)),
    st.text(max_size=300),
)
prefixes = st.sampled_from(["", "A title\n", "Title: ", "日本\n"])


def token_span(offsets: list[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The document's tokens that start in text[start:end]."""
    return bisect_left(offsets, (start,)), bisect_left(offsets, (end,))


def around(blank: list[bool], index: int) -> set[int]:
    """``index`` and the token edges reachable from it over whitespace-only tokens (they may go
    to either side of a cut)."""
    found = {index}
    back = index
    while back > 0 and blank[back - 1]:
        back -= 1
        found.add(back)
    while index < len(blank) and blank[index]:
        index += 1
        found.add(index)
    return found


def character_start(offsets: list[tuple[int, int]], index: int, previous: int) -> int:
    """``index``, moved back to a character's first token, but not to ``previous``: then forward."""
    def inside(j: int) -> bool:
        return 0 < j < len(offsets) and offsets[j][0] < offsets[j - 1][1]

    back = index
    while back > previous and (inside(back) or offsets[back][0] <= offsets[previous][0]):
        back -= 1
    if back > previous:
        return back
    while inside(index):
        index += 1
    return index


def strip(text: str, start: int, end: int) -> tuple[int, int]:
    piece = text[start:end]
    start += len(piece) - len(piece.lstrip())
    return start, start + len(piece.strip())


def check_chunks(rule, options: ChunkingOptions, text: str, prefix: str) -> None:
    """The rules every chunking must keep, checked against the server's own count."""
    document = Chunker(options, rule.counter).chunk(text, prefix)
    offsets = rule.counter.offsets([text])[0]
    assert document.tokens == len(offsets)
    assert document.problem is None or not document.chunks
    limit = options.max_tokens
    for index, chunk in enumerate(document.chunks):
        assert chunk.index == index
        assert chunk.text == prefix + text[chunk.char_start:chunk.char_end]  # offsets round-trip
        body = text[chunk.char_start:chunk.char_end]
        assert body.strip() == body and body  # not empty, no whitespace at either edge
        assert chunk.tokens == rule.server_count(chunk.text) <= limit  # by the built-in server's count
    ordered = [(chunk.char_start, chunk.char_end) for chunk in document.chunks]
    assert ordered == sorted(ordered)
    if document.problem is not None:
        return
    # every token with text is in a chunk; in exactly one when there is no overlap
    for start, end in offsets:
        if text[start:end].strip():
            start, end = strip(text, start, end)  # a token may carry the space before it (Metaspace)
            holders = sum(chunk.char_start <= start and end <= chunk.char_end for chunk in document.chunks)
            assert holders == 1 if options.overlap_tokens == 0 else holders >= 1, (start, end)
    if options.strategy == "tokens":
        blank = [not text[start:end].strip() for start, end in offsets]
        visible = [strip(text, *span) if text[slice(*span)].strip() else span for span in offsets]
        for before, after in pairwise(document.chunks):
            ends = around(blank, token_span(visible, before.char_start, before.char_end)[1])
            starts = around(blank, token_span(visible, after.char_start, after.char_end)[0])
            # exact overlap, in document tokens (moved to a character's first token when needed)
            assert any(character_start(offsets, end - options.overlap_tokens, before_start) in starts
                       for end in ends for before_start in around(blank, token_span(visible, before.char_start,
                                                                                    before.char_end)[0]))
    else:
        # a unit that fits beside the overlap (as sent, with the prefix) is never split
        room = limit - options.overlap_tokens
        units = split_sentences(text) if options.strategy == "sentences" else [
            unit for paragraph in split_paragraphs(text)
            for unit in ([paragraph] if rule.server_count(prefix + text[slice(*paragraph)]) <= room
                         else split_sentences(text, *paragraph))]
        for start, end in units:
            if rule.server_count(prefix + text[start:end]) <= room:
                assert any(c.char_start <= start and end <= c.char_end for c in document.chunks), (start, end)
        if options.overlap_tokens:
            check_overlap(text, offsets, document.chunks, options.overlap_tokens)


def check_overlap(text: str, offsets: list[tuple[int, int]], chunks: Sequence[Chunk], overlap: int) -> None:
    """Every two neighbouring chunks share ``overlap`` of the document's tokens, or all the first holds
    past its first character when it holds fewer (a character may be several tokens: a chunk starts
    at a character's edge)."""
    visible = [strip(text, start, end) if text[start:end].strip() else (start, end) for start, end in offsets]
    for before, after in pairwise(chunks):
        first, stop = token_span(visible, before.char_start, before.char_end)
        past_first = sum(visible[j][0] > visible[first][0] for j in range(first, stop))
        shared_first, shared_stop = token_span(visible, after.char_start, before.char_end)
        while shared_first > first + 1 and not text[slice(*offsets[shared_first - 1])].strip():
            shared_first -= 1  # whitespace tokens (Metaspace's) at a chunk's edges are left out of it
        while shared_stop < len(offsets) and not text[slice(*offsets[shared_stop])].strip():
            shared_stop += 1
        assert shared_stop - shared_first >= min(overlap, past_first), (before, after)


@pytest.mark.parametrize("strategy", TOKEN_STRATEGIES)
@pytest.mark.parametrize("rule_name", RULES)
@PROPERTY_SETTINGS
@given(text=texts, prefix=prefixes, max_tokens=st.sampled_from([12, 20, 40]),
       overlap=st.sampled_from([0, 0, 3, 7]))
def test_chunks_keep_the_rules(token_rules, rule_name: str, strategy: str, text: str, prefix: str,
                               max_tokens: int, overlap: int) -> None:
    check_chunks(token_rules[rule_name], ChunkingOptions(max_tokens, overlap, strategy), text, prefix)


@pytest.mark.parametrize("strategy", ["sentences", "paragraphs"])
def test_units_overlap_by_overlap_tokens_around_a_sentence_cut_for_length(token_rules, strategy: str) -> None:
    rule = token_rules["minilm"]
    short = "The fox jumps over the dog. It was quick! Was it brown? "
    long = "This sentence has no end " + "and goes on " * 40 + "until here. "
    text = short * 4 + long + short * 3 + "\n\n" + short * 5
    options = ChunkingOptions(48, 12, strategy)
    document = Chunker(options, rule.counter).chunk(text)
    offsets = list(rule.counter.offsets([text])[0])
    cut = [c for c in document.chunks if c.char_start < text.index("until") and c.char_end > text.index("and goes")]
    assert len(cut) > 2  # the long sentence is cut into windows, each next to its neighbours
    check_overlap(text, offsets, document.chunks, 12)
    for before, after in pairwise(document.chunks):  # exactly the overlap here: one token a character
        first, stop = token_span(offsets, after.char_start, before.char_end)
        assert stop - first == 12, (before, after)
    assert all(chunk.tokens == rule.server_count(chunk.text) <= 48 for chunk in document.chunks)


@pytest.mark.parametrize("rule_name", RULES)
@pytest.mark.parametrize("text", [
    pytest.param("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo0NTY3ODkrLw" * 40, id="base64-blob"),
    pytest.param("日本語のテキストです中文句子也在这里" * 30, id="cjk-no-spaces"),
    pytest.param("🙂👩‍👩‍👧é" * 60, id="emoji-run"),
    pytest.param("word " * 400, id="many-words"),
    pytest.param("antidisestablishmentarianism" * 30, id="one-long-word"),
])
@pytest.mark.parametrize("strategy", TOKEN_STRATEGIES)
def test_text_without_spaces_is_cut_within_limits(token_rules, rule_name: str, text: str, strategy: str) -> None:
    rule = token_rules[rule_name]
    for overlap in (0, 5):
        options = ChunkingOptions(32, overlap, strategy)
        check_chunks(rule, options, text, "")
        document = Chunker(options, rule.counter).chunk(text)
        # WordPiece makes a word over 100 characters one [UNK]: that fits whole
        assert len(document.chunks) > 1 or document.tokens == 1


@pytest.mark.parametrize("rule_name", RULES)
def test_tokens_without_overlap_embed_every_token_once(token_rules, rule_name: str) -> None:
    rule = token_rules[rule_name]
    text = Path(chunking.__file__).read_text(encoding="utf-8") * 3
    document = Chunker(ChunkingOptions(128), rule.counter).chunk(text)
    offsets = rule.counter.offsets([text])[0]
    blank = [not text[start:end].strip() for start, end in offsets]  # whitespace tokens go either side
    spans = [token_span(offsets, chunk.char_start, chunk.char_end) for chunk in document.chunks]
    assert 0 in around(blank, spans[0][0]) and document.tokens in around(blank, spans[-1][1])
    assert all(around(blank, before[1]) & around(blank, after[0])  # tokens embedded / tokens in corpus = 1
               for before, after in pairwise(spans))
    # chunks are nearly full: only the last is short, and a word is not cut to fill one (where
    # whitespace makes tokens, as in Metaspace's indentation, those at a chunk's edges are left out)
    special = rule.counter.special_tokens
    assert any(blank) or all(end - start >= 128 - special - WORD_BACKOFF_TOKENS - 4 for start, end in spans[:-1])


def test_chunks_end_at_whitespace_rather_than_inside_a_word(token_rules) -> None:
    rule = token_rules["minilm"]
    text = " ".join(["unbelievably", "xylophonist", "antidisestablishmentarianism"] * 50)
    for chunk in Chunker(ChunkingOptions(40), rule.counter).chunk(text).chunks:
        assert chunk.char_end == len(text) or text[chunk.char_end] == " "
        assert chunk.char_start == 0 or text[chunk.char_start - 1] == " "


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_same_input_same_chunks_and_batch_equals_one_by_one(token_rules, strategy: str) -> None:
    counter = None if strategy == "chars" else token_rules["minilm"].counter
    chunker = Chunker(ChunkingOptions(30, 4, strategy), counter)
    docs = ["First sentence here. Second one follows!\n\nA new paragraph 日本語。とても長い文です。" * 5,
            "", "   ", "short", "naïve café " * 40]
    prefixes = ["T\n", "", "x ", "", "Title: "]
    batch = chunker.chunk_batch(docs, prefixes)
    assert batch == [chunker.chunk(doc, prefix) for doc, prefix in zip(docs, prefixes, strict=True)]
    assert batch == chunker.chunk_batch(docs, prefixes)
    assert batch[1].chunks == batch[2].chunks == ()


def test_chars_counts_characters_with_exact_overlap() -> None:
    text = "abcdefghij " * 100
    document = Chunker(ChunkingOptions(100, 10, "chars")).chunk(text, "T: ")
    assert all(len(chunk.text) == chunk.tokens <= 100 for chunk in document.chunks)
    assert all(chunk.text.startswith("T: ") for chunk in document.chunks)
    assert document.tokens == len(text)
    starts = [chunk.char_start for chunk in document.chunks]
    assert "".join(text[a:b] for a, b in zip(starts, [*starts[1:], len(text)], strict=True)).rstrip() == text.rstrip()


def test_prefix_counts_against_max_tokens(token_rules) -> None:
    rule = token_rules["minilm"]
    chunker = Chunker(ChunkingOptions(24, 2), rule.counter)
    text = "the quick brown fox jumps over the lazy dog " * 20
    with_title = chunker.chunk(text, "A fairly long title about foxes\n")
    without = chunker.chunk(text)
    assert len(with_title.chunks) > len(without.chunks)
    assert all(chunk.tokens == rule.server_count(chunk.text) <= 24 for chunk in with_title.chunks)


def test_a_prefix_that_leaves_no_room_is_a_problem_not_an_error(token_rules) -> None:
    chunker = Chunker(ChunkingOptions(16, 4), token_rules["minilm"].counter)
    document = chunker.chunk("some text to embed", "a title far too long for sixteen tokens of room\n")
    assert document.chunks == ()
    assert document.problem is not None and "overlap_tokens (4)" in document.problem
    assert chunking.REJECT_UNCHUNKABLE == "unchunkable"


@pytest.mark.parametrize(("kwargs", "message"), [
    pytest.param({"max_tokens": 0}, "max_tokens must be at least 1", id="max-tokens"),
    pytest.param({"max_tokens": 10, "overlap_tokens": 10}, "overlap_tokens must be", id="overlap-too-big"),
    pytest.param({"max_tokens": 10, "overlap_tokens": -1}, "overlap_tokens must be", id="overlap-negative"),
    pytest.param({"max_tokens": 10, "strategy": "words"}, "strategy 'words' is not one of", id="strategy"),
])
def test_options_are_checked(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ChunkingOptions(**kwargs)  # type: ignore[arg-type]


def test_chunker_needs_the_right_counter(token_rules) -> None:
    counter = token_rules["minilm"].counter
    with pytest.raises(ValueError, match="needs the servers' token counter"):
        Chunker(ChunkingOptions(10, 0, "tokens"))
    with pytest.raises(ValueError, match="give no token counter"):
        Chunker(ChunkingOptions(10, 0, "chars"), counter)
    with pytest.raises(ValueError, match="less the model's 2 special tokens"):
        Chunker(ChunkingOptions(10, 8, "tokens"), counter)


@pytest.mark.parametrize(("rule_name", "cuts"), [
    pytest.param("minilm", CUTS_WHITESPACE, id="minilm"),
    pytest.param("wordpiece", CUTS_WHITESPACE, id="wordpiece"),
    pytest.param("bpe", CUTS_NONE, id="byte-level-bpe"),
    pytest.param("unigram", CUTS_NONE, id="metaspace-unigram"),
    pytest.param("hashing", CUTS_TOKENS, id="hashing"),
])
def test_each_rule_says_where_its_counts_add_up(token_rules, rule_name: str, cuts: str) -> None:
    assert token_rules[rule_name].counter.cuts == cuts


@pytest.mark.parametrize("module", ["chunking", "token_count", "tokenizer_files", "text_units"])
def test_chunking_modules_stay_in_the_corpus_layer(module: str) -> None:
    source = (Path(chunking.__file__).parent / f"{module}.py").read_text(encoding="utf-8")
    imported = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            imported |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            imported.add(node.module)
    forbidden = ("ray", "pyarrow", "teibatch.pipeline", "teibatch.sink", "teibatch.fleet", "teibatch.tei")
    assert not [name for name in imported if name.split(".")[0] in forbidden or name.startswith(forbidden)]
