"""Counting tokens word by word, for tokenizers whose counts add up at whitespace.

A tokenizer with ``cuts: whitespace`` (see :mod:`teibatch.token_cuts`: BERT's WordPiece models
such as all-MiniLM, bge, e5 and gte) tokenizes each whitespace-separated word alone, so a text's
tokens are its words' tokens one after the other, and its count is the sum of its words' counts
(plus the special tokens). Natural text repeats its words, so :class:`WordCounter` keeps the count
of each word it has seen (:data:`DEFAULT_CACHE_WORDS` at most) and sends only the words it has not
seen to the tokenizer, in one ``encode_batch`` per call: that is what makes the chunker count
faster than the tokenizer encodes. Where BERT's pre-tokenizer also makes each ASCII punctuation
character a token of its own, a word not seen is counted as its pieces between them, so that
code (``self._sock.send(data)``), whose whole words rarely repeat, is counted from its names.

Nothing is approximated. A word is the text between the characters of :data:`SPACE` (which every
such tokenizer splits at); a word's tokens alone are its tokens in the text, moved by the word's
start. The chunker reads token offsets only around its cuts, so :class:`WordOffsets` gives a
text's offsets on demand, encoding only the words asked about (a word longer than
:data:`LONG_WORD_CHARS`, such as text without spaces, is encoded with its offsets at once and
never kept in the cache).
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate, islice
from typing import Any, overload

SPACE = " \t\n\r"
"""The whitespace every tokenizer with ``cuts: whitespace`` splits words at (some drop other control
characters, such as U+0085, rather than split at them)."""

DEFAULT_CACHE_WORDS = 1 << 18
"""Words whose counts a :class:`WordCounter` keeps; when full, the older half is dropped. The
offsets of an eighth as many words are kept too, for the words the chunker reads around its cuts."""

LONG_WORD_CHARS = 128
"""Words longer than this (a URL, a base64 blob, CJK text without spaces) are not kept: they rarely
repeat, and the chunker usually needs their offsets, so they are encoded with them at once."""

_SPLIT = re.compile(f"([{SPACE}]+)")
_PUNCTUATION = re.compile(r"""([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~])""")  # ASCII punctuation, one by one


class WordCounter:
    """Counts texts with a ``tokenizers.Tokenizer`` (truncation and padding off) word by word,
    keeping up to ``max_words`` words' counts. Safe to share between threads.

    Where counts also add up at each ASCII punctuation character (BERT's pre-tokenizer makes each
    one a token of its own), ``keep_whole`` lists the added tokens' texts (else it is ``None``): a
    word not seen is then counted as its pieces between those characters (``self._sock.send(data)``
    as ``self``, ``.``, ``_``, ...), which repeat far more often than whole words in code, unless
    it holds one of those texts (``[MASK]`` would be cut)."""

    def __init__(self, tokenizer: Any, max_words: int = DEFAULT_CACHE_WORDS,
                 keep_whole: Sequence[str] | None = None) -> None:
        if max_words < 1:
            raise ValueError(f"max_words must be at least 1, not {max_words}")
        self._tok = tokenizer
        self._max_words = max_words
        self._by_pieces = keep_whole is not None
        # one search for all the added tokens' texts (none: a pattern that never matches)
        self._held = re.compile("|".join(map(re.escape, keep_whole or ())) or r"(?!)")
        self._counts: dict[str, int] = {}
        self._offsets: dict[str, list[tuple[int, int]]] = {}
        self.encoded_words = 0  # texts (words or their pieces) sent to the tokenizer so far
        # encode_batch_fast (tokenizers >= 0.21) skips the offsets, which counting does not need.
        self._count_batch = getattr(tokenizer, "encode_batch_fast", tokenizer.encode_batch)

    @property
    def cached_words(self) -> int:
        """How many words' (and pieces') counts are kept now."""
        return len(self._counts)

    def counts(self, texts: Sequence[str]) -> list[int]:
        """Each text's tokens, special tokens left out."""
        words = [_SPLIT.split(text)[0::2] for text in texts]
        return [sum(counts) for counts in self._word_counts(words, None)]

    def offsets(self, texts: Sequence[str]) -> list[WordOffsets]:
        """Each text's token offsets (special tokens left out), read on demand."""
        pieces = [_SPLIT.split(text) for text in texts]
        words = [text_pieces[0::2] for text_pieces in pieces]
        long_offsets: dict[str, list[tuple[int, int]]] = {}
        counts = self._word_counts(words, long_offsets)
        return [WordOffsets(self, text_words, text_pieces, text_counts, long_offsets)
                for text_words, text_pieces, text_counts in zip(words, pieces, counts, strict=True)]

    def word_offsets(self, word: str) -> list[tuple[int, int]]:
        """The offsets of one word's tokens, encoded alone."""
        offsets = self._offsets.get(word)
        if offsets is None:
            self.encoded_words += 1
            offsets = self._tok.encode(word, add_special_tokens=False).offsets
            if len(word) <= LONG_WORD_CHARS:
                _keep(self._offsets, {word: offsets}, max(1, self._max_words // 8))
        return offsets

    def _word_counts(self, texts_words: list[list[str]],
                     long_offsets: dict[str, list[tuple[int, int]]] | None) -> list[list[int]]:
        """Each word's count, text by text, from the cache or one batch for the words not in it.
        With ``long_offsets``, the long words are encoded with their offsets, put there."""
        cache = self._counts
        known = self._encode([word for word in set().union(*texts_words) if word not in cache], long_offsets)
        _keep(cache, {word: count for word, count in known.items() if len(word) <= LONG_WORD_CHARS}, self._max_words)
        looked_up = [list(map(cache.get, words)) for words in texts_words]
        # None: a long word (never kept), or a word another thread's _keep dropped meanwhile
        gaps = [words for words, counts in zip(texts_words, looked_up, strict=True) if None in counts]
        if gaps:
            known.update(self._encode([word for word in set().union(*gaps) if word not in known and word not in cache],
                                      long_offsets))
        return [[known[word] if count is None else count for word, count in zip(words, counts, strict=True)]
                if None in counts else counts  # type: ignore[misc]  # None only where known has it
                for words, counts in zip(texts_words, looked_up, strict=True)]

    def _encode(self, words: list[str], long_offsets: dict[str, list[tuple[int, int]]] | None) -> dict[str, int]:
        """The counts of ``words``, encoded in one batch (two with ``long_offsets``: see _word_counts)."""
        long_words = [word for word in words if len(word) > LONG_WORD_CHARS] if long_offsets is not None else []
        short = [word for word in words if len(word) <= LONG_WORD_CHARS] if long_words else words
        counts = self._pieces_counts(short) if self._by_pieces else self._batch_counts(short)
        if long_words and long_offsets is not None:
            self.encoded_words += len(long_words)
            for word, encoding in zip(long_words, self._tok.encode_batch(long_words, add_special_tokens=False),
                                      strict=True):
                long_offsets[word] = encoding.offsets
                counts[word] = len(encoding.offsets)
        return counts

    def _batch_counts(self, texts: list[str]) -> dict[str, int]:
        if not texts:
            return {}
        self.encoded_words += len(texts)
        encodings = self._count_batch(texts, add_special_tokens=False)
        return dict(zip(texts, (len(encoding.ids) for encoding in encodings), strict=True))

    def _pieces_counts(self, words: list[str]) -> dict[str, int]:
        """The counts of ``words``, each the sum of its pieces between ASCII punctuation characters
        (see the class docstring); the pieces not kept are encoded in one batch and kept."""
        whole = [word for word in words if self._held.search(word)]
        held = set(whole)
        split = [word for word in words if word not in held] if held else words
        pieces = [list(filter(None, _PUNCTUATION.split(word))) for word in split]
        cache = self._counts
        known = self._batch_counts([piece for piece in set().union(*pieces) if piece not in cache])
        _keep(cache, known, self._max_words)
        counts = self._batch_counts(whole)
        lost = []  # words with a piece another thread's _keep dropped meanwhile
        for word, word_pieces in zip(split, pieces, strict=True):
            piece_counts = [known[piece] if piece in known else cache.get(piece) for piece in word_pieces]
            if None in piece_counts:
                lost.append(word)
            else:
                counts[word] = sum(piece_counts)  # type: ignore[arg-type]  # no None
        counts.update(self._batch_counts(lost))
        return counts


class WordOffsets(Sequence[tuple[int, int]]):
    """One text's token offsets (``(start, end)`` characters, special tokens left out), as the
    tokenizer gives them for the whole text; a word's are encoded when one of them is first read."""

    __slots__ = ("_counter", "_counts", "_cum", "_long", "_pieces", "_size", "_starts", "_words")

    def __init__(self, counter: WordCounter, words: list[str], pieces: list[str], counts: list[int],
                 long_offsets: dict[str, list[tuple[int, int]]]) -> None:
        self._counter = counter
        self._words = words
        self._pieces = pieces  # the words and the whitespace between them, in turn
        self._counts = counts
        self._long = long_offsets
        self._size = sum(counts)
        # built on the first read: a text that fits one chunk is never read
        self._cum: list[int] = []  # tokens before each word, and after the last
        self._starts: list[int] = []  # each word's first character

    def __len__(self) -> int:
        return self._size

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence (a list, as other counters give) of the same offsets."""
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(self) == len(other) and all(mine == theirs for mine, theirs in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # equal to lists, which have no hash

    @overload
    def __getitem__(self, index: int) -> tuple[int, int]: ...

    @overload
    def __getitem__(self, index: slice) -> list[tuple[int, int]]: ...

    def __getitem__(self, index: int | slice) -> tuple[int, int] | list[tuple[int, int]]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._size))]
        if index < 0:
            index += self._size
        if not 0 <= index < self._size:
            raise IndexError("token index out of range")
        cum, starts = self._index()
        word = bisect_right(cum, index) - 1  # the last word starting at or before it: one with tokens
        start, end = self._offsets_of(word)[index - cum[word]]
        return start + starts[word], end + starts[word]

    def __iter__(self) -> Iterator[tuple[int, int]]:
        cum, starts = self._index()
        for word, base in enumerate(starts):
            if cum[word + 1] > cum[word]:
                yield from ((start + base, end + base) for start, end in self._offsets_of(word))

    def first_at(self, char: int) -> int:
        """The first token that starts at or after character ``char`` (``len(self)`` if none):
        ``bisect_left(offsets, (char,))``, reading a word's tokens only when ``char`` is inside it."""
        cum, starts = self._index()
        word = bisect_right(starts, char) - 1
        if word < 0:
            return 0
        start = starts[word]
        if char == start:  # the tokens before lie in the words before
            return cum[word]
        if char > start + len(self._words[word]):  # in the whitespace after the word
            return cum[word + 1]
        return cum[word] + bisect_left(self._offsets_of(word), (char - start,))

    def clean(self, j: int) -> bool:
        """Whether tokens ``j - 1`` and ``j`` share no character (``offsets[j][0] >= offsets[j - 1][1]``,
        ``0 < j < len(self)``): always so between two words."""
        if not 0 < j < self._size:
            return False
        cum, _ = self._index()
        word = bisect_right(cum, j) - 1
        k = j - cum[word]
        if k == 0:
            return True
        offsets = self._offsets_of(word)
        return offsets[k][0] >= offsets[k - 1][1]

    def at_space(self, j: int) -> bool:
        """Whether whitespace of :data:`SPACE` comes just before token ``j`` and it is :meth:`clean`:
        a cut there does not split a word."""
        if not 0 < j < self._size:
            return False
        cum, starts = self._index()
        word = bisect_right(cum, j) - 1
        if starts[word] == 0:  # the first word: nothing before it
            return False
        offsets = self._offsets_of(word)
        k = j - cum[word]
        # only the word's first character follows whitespace (a word holds none)
        return offsets[k][0] == 0 and (k == 0 or offsets[k - 1][1] <= 0)

    def _index(self) -> tuple[list[int], list[int]]:
        if not self._cum:
            self._starts = list(accumulate(map(len, self._pieces), initial=0))[0::2]
            self._cum = list(accumulate(self._counts, initial=0))
        return self._cum, self._starts

    def _offsets_of(self, word: int) -> list[tuple[int, int]]:
        if not self._counts[word]:
            return []
        text = self._words[word]
        offsets = self._long.get(text)
        return offsets if offsets is not None else self._counter.word_offsets(text)


def _keep(cache: dict[str, Any], fresh: dict[str, Any], max_words: int) -> None:
    """Add ``fresh`` to ``cache``, first dropping its oldest entries (insertion order is age) when
    it would hold more than ``max_words``: the older half, in one go, so that dropping is rare."""
    fresh = {word: value for word, value in fresh.items() if word not in cache}  # a piece may be a word too
    overflow = len(cache) + len(fresh) - max_words
    if overflow > 0:
        for word in list(islice(cache, max(overflow, len(cache) // 2))):
            cache.pop(word, None)  # another thread may have dropped it already
    cache.update(islice(fresh.items(), max_words))
