"""Cutting long documents into chunks that fit the served model, counted by the servers' own rule.

A chunk is a span of the original text: ``text[char_start:char_end]`` (offsets into the Python
``str``), sent as ``prefix + that span``. The rules, for every strategy:

* every chunk's count, as the server counts the text sent (special tokens and prefix included), is
  at most ``max_tokens``; where slicing the document's tokens cannot promise the count (see
  :mod:`teibatch.corpus.token_count`), the chunk is counted again and shrunk until it fits;
* no chunk is empty or whitespace only, and none starts or ends with whitespace;
* the chunks come in text order, and the same text, prefix and options give the same chunks.

Strategies:

* ``tokens``: windows of at most ``max_tokens`` tokens (less the special tokens and the prefix's).
  Chunk *i+1* starts exactly ``overlap_tokens`` tokens of the document's tokenization before chunk
  *i* ends, so with no overlap every token of the document is in exactly one chunk. (Where that
  token shares its character with the one before, as when byte-level BPE or BERT's normalizer cuts
  one character into several tokens, the chunk starts at the nearest character edge before it, or
  after it if there is none after the start of chunk *i*.) A chunk ends
  at whitespace when there is some among its last 16 tokens (a word is not cut), else at its last
  token that does not share a character with the next (text without spaces: CJK, a base64 blob).
* ``sentences`` and ``paragraphs`` (see :mod:`teibatch.corpus.text_units`): whole units are packed
  in order while they fit. Each chunk after the first starts with the last ``overlap_tokens`` tokens
  of the chunk before, as for ``tokens`` (from the nearest character edge before them; so the
  overlap may start inside a unit, even inside a word), then holds whole units while they fit. A
  unit that does not fit beside that overlap (more than ``max_tokens - overlap_tokens`` as sent) is
  cut: a paragraph into its sentences, a sentence into token windows as above, the first of which
  starts with the overlap too. So every two neighbouring chunks share ``overlap_tokens`` tokens of
  the document, or all of the first but its first token when it holds fewer (only the first chunk
  can, when the unit after it needs nearly the whole chunk).
* ``chars``: as ``tokens``, with characters for tokens (:class:`~teibatch.corpus.token_count.CharCounter`);
  for when no tokenizer is at hand and the user asked for it.

The prefix (say, a title and a line break) starts every chunk's text and counts against
``max_tokens``; a document whose prefix leaves no room for ``overlap_tokens + 1`` tokens is not
chunked: its :class:`ChunkedDocument` has no chunks and says why in ``problem``.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from dataclasses import dataclass

from teibatch.corpus.text_units import split_paragraphs, split_sentences
from teibatch.corpus.token_count import CUTS_NONE, CUTS_TOKENS, CharCounter, TokenCounter
from teibatch.corpus.word_counts import SPACE, WordOffsets

STRATEGY_TOKENS = "tokens"
STRATEGY_SENTENCES = "sentences"
STRATEGY_PARAGRAPHS = "paragraphs"
STRATEGY_CHARS = "chars"
STRATEGIES = (STRATEGY_TOKENS, STRATEGY_SENTENCES, STRATEGY_PARAGRAPHS, STRATEGY_CHARS)

REJECT_UNCHUNKABLE = "unchunkable"
"""The reject reason for a document the chunker could not cut (its ``problem`` is the detail)."""

WORD_BACKOFF_TOKENS = 16
"""How many tokens a chunk's end may move back to fall on whitespace rather than inside a word."""

EDGE_SCAN_TOKENS = 64
"""How far from a chunk's edge whitespace is looked for, to count only the edge again; past it the
whole chunk is counted again."""

_SPACE = frozenset(SPACE)


@dataclass(frozen=True)
class ChunkingOptions:
    """How documents are cut: at most ``max_tokens`` per chunk as the server counts it (special tokens
    and prefix included), ``overlap_tokens`` shared between neighbours, and the ``strategy``."""

    max_tokens: int
    overlap_tokens: int = 0
    strategy: str = STRATEGY_TOKENS

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ValueError(f"strategy {self.strategy!r} is not one of {', '.join(STRATEGIES)}")
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, not {self.max_tokens}")
        if not 0 <= self.overlap_tokens < self.max_tokens:
            raise ValueError(f"overlap_tokens must be at least 0 and below max_tokens ({self.max_tokens}), "
                             f"not {self.overlap_tokens}")


@dataclass(frozen=True)
class Chunk:
    """One chunk: ``text`` (the prefix, then ``document[char_start:char_end]``) is what is sent, and
    ``tokens`` is its count as the server counts it, special tokens included."""

    index: int
    char_start: int
    char_end: int
    tokens: int
    text: str


@dataclass(frozen=True)
class ChunkedDocument:
    """A document's chunks in text order, and its own tokens (no prefix, no special tokens): what
    "tokens in the corpus" counts. ``problem`` says why a document got no chunks, when it could not
    be cut (see :data:`REJECT_UNCHUNKABLE`); an empty or whitespace-only text simply has none."""

    chunks: tuple[Chunk, ...]
    tokens: int
    problem: str | None = None


@dataclass(slots=True)
class _Document:
    """One document while it is being cut."""

    text: str
    offsets: Sequence[tuple[int, int]]
    prefix: str
    prefix_tokens: int
    budget: int  # document tokens a chunk may hold
    joins: bool  # the prefix ends where counts add up (empty, or ends with whitespace)
    words: WordOffsets | None = None  # the offsets again, when read on demand: they answer faster

    @property
    def size(self) -> int:
        return len(self.offsets)

    def first_at(self, char: int) -> int:
        """The first token that starts at or after character ``char``."""
        if self.words is not None:
            return self.words.first_at(char)
        return bisect_left(self.offsets, (char,))

    def clean(self, j: int) -> bool:
        """Whether tokens j-1 and j share no character, so the text can be cut between them."""
        if self.words is not None:
            return self.words.clean(j)
        offsets = self.offsets
        return 0 < j < len(offsets) and offsets[j][0] >= offsets[j - 1][1]

    def at_space(self, j: int) -> bool:
        """Whether whitespace comes just before token j (a cut there does not split a word)."""
        if self.words is not None:
            return self.words.at_space(j)
        start = self.offsets[j][0]
        return start > 0 and self.text[start - 1] in _SPACE and self.clean(j)


class Chunker:
    """Cuts documents into chunks under :class:`ChunkingOptions`, counting with ``counter`` (the
    servers' rule; none for ``strategy: chars``). Use :meth:`chunk_batch` for many documents: their
    tokenization is one batch, which ``tokenizers`` spreads over its threads."""

    def __init__(self, options: ChunkingOptions, counter: TokenCounter | None = None) -> None:
        if options.strategy == STRATEGY_CHARS:
            if counter is not None:
                raise ValueError("strategy 'chars' counts characters: give no token counter")
            counter = CharCounter()
        elif counter is None:
            raise ValueError(f"strategy {options.strategy!r} needs the servers' token counter")
        if options.overlap_tokens >= options.max_tokens - counter.special_tokens:
            raise ValueError(f"overlap_tokens ({options.overlap_tokens}) must be below max_tokens "
                             f"({options.max_tokens}) less the model's {counter.special_tokens} special tokens")
        self.options = options
        self.counter = counter
        self._max = options.max_tokens
        self._overlap = options.overlap_tokens

    def chunk(self, text: str, prefix: str = "") -> ChunkedDocument:
        """The chunks of one document; see :meth:`chunk_batch` for many."""
        return self.chunk_batch([text], [prefix])[0]

    def chunk_batch(self, texts: Sequence[str], prefixes: Sequence[str] | None = None) -> list[ChunkedDocument]:
        """The chunks of each text, in order; ``prefixes`` (one per text) start each of its chunks."""
        if prefixes is None:
            prefixes = [""] * len(texts)
        elif len(prefixes) != len(texts):
            raise ValueError(f"{len(prefixes)} prefixes for {len(texts)} texts")
        special = self.counter.special_tokens
        distinct = sorted({prefix for prefix in prefixes if prefix})
        prefix_tokens = {"": 0, **{prefix: count - special for prefix, count
                                   in zip(distinct, self.counter.counts(distinct), strict=True)}}
        results = []
        for text, prefix, offsets in zip(texts, prefixes, self.counter.offsets(texts), strict=True):
            tokens = prefix_tokens[prefix]
            document = _Document(text, offsets, prefix, tokens, self._max - special - tokens,
                                 joins=not prefix or prefix[-1] in _SPACE,
                                 words=offsets if isinstance(offsets, WordOffsets) else None)
            results.append(self._document(document))
        return results

    def _document(self, doc: _Document) -> ChunkedDocument:
        if doc.budget <= self._overlap:
            return ChunkedDocument((), doc.size, f"the prefix takes {doc.prefix_tokens} of max_tokens "
                                   f"({self._max}) with the {self.counter.special_tokens} special tokens, "
                                   f"leaving no room for overlap_tokens ({self._overlap}) and one more token")
        spans: list[tuple[int, int, int]] = []
        if self.options.strategy in (STRATEGY_SENTENCES, STRATEGY_PARAGRAPHS):
            done = self._pack(doc, self._units(doc), spans)
        else:
            done = self._windows(doc, 0, doc.size, 0, len(doc.text), spans) is not None
        if not done:
            return ChunkedDocument((), doc.size, f"a piece of text that cannot be cut (one character, or one "
                                   f"token) counts more than max_tokens ({self._max}) with the prefix")
        chunks = tuple(Chunk(index, start, end, count, doc.prefix + doc.text[start:end])
                       for index, (start, end, count) in enumerate(spans))
        return ChunkedDocument(chunks, doc.size)

    def _windows(self, doc: _Document, lo: int, hi: int, clip_start: int, clip_end: int,
                 spans: list[tuple[int, int, int]], begin: int | None = None) -> int | None:
        """Append the token windows of tokens ``lo..hi`` (text ``clip_start..clip_end``) to ``spans``; the
        first starts at token ``begin`` when it repeats the end of the chunk before (its overlap). The
        last window's first token; None when a window cannot be made to fit."""
        start = lo if begin is None else begin
        floor = max(lo, start + self._overlap) + 1  # a new token, and the next window starts after this one
        while True:
            end = self._cut(doc, min(start + doc.budget, hi), floor, hi)
            while True:
                char_start = clip_start if start == lo else doc.offsets[start][0]
                char_end = clip_end if end == hi else doc.offsets[end - 1][1]
                char_start, char_end = _strip(doc.text, char_start, char_end)
                if char_start >= char_end:
                    break  # whitespace only: no chunk
                count = self._measure(doc, start, end, char_start, char_end)
                if count <= self._max:
                    spans.append((char_start, char_end, count))
                    break
                target = min(max(floor, end - (count - self._max)), end - 1)
                if target < floor:
                    return None
                end_before, end = end, self._cut(doc, target, floor, hi)
                if end >= end_before:
                    return None
            if end >= hi:
                return start
            start = self._overlap_start(doc, start, end)
            floor = end + 1  # the next window holds a token this one did not

    def _overlap_start(self, doc: _Document, previous: int, end: int) -> int:
        """Where the chunk after ``previous..end`` starts: ``overlap_tokens`` before ``end`` (but after
        ``previous``), moved to the nearest character edge before it (after it if there is none after
        ``previous``)."""
        start = max(end - self._overlap, previous + 1)
        after = doc.offsets[previous][0]  # past the previous window's first character
        back = next((j for j in range(start, previous, -1) if doc.clean(j) and doc.offsets[j][0] > after), None)
        return back if back is not None else next(j for j in range(start, end + 1) if j == end or doc.clean(j))

    def _cut(self, doc: _Document, target: int, floor: int, hi: int) -> int:
        """Where to end a window that may end at token ``target`` at most and ``floor`` at least:
        ``target`` if at whitespace, else the last whitespace at most WORD_BACKOFF_TOKENS back, else
        the last clean cut; past ``target`` only when nothing before it is clean."""
        if target >= hi or doc.at_space(target):
            return min(target, hi)
        for j in range(target - 1, max(floor, target - WORD_BACKOFF_TOKENS) - 1, -1):
            if doc.at_space(j):
                return j
        for j in range(target, floor - 1, -1):
            if doc.clean(j):
                return j
        return next((j for j in range(target + 1, hi) if doc.clean(j)), hi)

    def _units(self, doc: _Document) -> list[tuple[int, int]]:
        """Sentences; or paragraphs, a paragraph too long to fit beside the overlap replaced by its sentences."""
        if self.options.strategy == STRATEGY_SENTENCES:
            return split_sentences(doc.text)
        units: list[tuple[int, int]] = []
        for start, end in split_paragraphs(doc.text):
            first, stop = doc.first_at(start), doc.first_at(end)
            if self._measure(doc, first, stop, start, end) > self._max - self._overlap:
                units += split_sentences(doc.text, start, end)
            else:
                units.append((start, end))
        return units

    def _pack(self, doc: _Document, units: list[tuple[int, int]], spans: list[tuple[int, int, int]]) -> bool:
        """Append chunks of whole units to ``spans`` (see the module docstring); False as for _windows."""
        # Unit k holds the tokens from bounds[k] to bounds[k + 1] (each token goes to the unit it starts in).
        bounds = [0, *(doc.first_at(unit_start) for unit_start, _ in units[1:]), doc.size]
        begin: int | None = None  # the next chunk's first token, when it repeats the end of the chunk before
        i = 0  # the next chunk's first new unit
        while i < len(units):
            start = bounds[i] if begin is None else begin
            char_start = units[i][0] if begin is None else _strip(doc.text, doc.offsets[begin][0], units[i][0])[0]
            chunk = self._fill(doc, units, bounds, start, char_start, i)
            if chunk is None:  # unit i does not fit beside the overlap: token windows inside it
                last = self._windows(doc, bounds[i], bounds[i + 1], units[i][0], units[i][1], spans, begin)
                if last is None:
                    return False
                start, i = last, i + 1
            else:
                i, count = chunk
                spans.append((char_start, units[i - 1][1], count))
            begin = None
            if self._overlap and i < len(units):
                end = doc.first_at(units[i - 1][1])  # the chunk's last token, not the whitespace after it
                begin = self._overlap_start(doc, start, end)
                begin = begin if begin < end else None
        return True

    def _fill(self, doc: _Document, units: list[tuple[int, int]], bounds: list[int], start: int, char_start: int,
              i: int) -> tuple[int, int] | None:
        """The chunk from token ``start`` (character ``char_start``: unit ``i``'s start, or the overlap's)
        that holds unit ``i`` and as many units after it as fit: ``(stop, count)`` for units ``i..stop``;
        None when unit ``i`` does not fit after ``start``."""
        if bounds[i + 1] - start > doc.budget:  # more than the budget in the document; maybe not as sent
            count = self._measure(doc, start, bounds[i + 1], char_start, units[i][1])
            return (i + 1, count) if count <= self._max else None
        stop = i + 1
        while stop < len(units) and bounds[stop + 1] - start <= doc.budget:
            stop += 1
        while True:
            count = self._measure(doc, start, bounds[stop], char_start, units[stop - 1][1])
            if count <= self._max:
                return stop, count
            if stop - 1 == i:
                return None
            stop -= 1

    def _measure(self, doc: _Document, start: int, end: int, char_start: int, char_end: int) -> int:
        """The server's count of ``prefix + text[char_start:char_end]``, whose tokens in the document
        are ``start..end``: by slicing where the counter promises it, else by counting again (only
        the edges, up to the first and last whitespace inside, where whitespace makes counts add up)."""
        rule = self.counter.cuts
        if rule == CUTS_NONE or not doc.joins or start >= end:
            return self._count(doc.prefix + doc.text[char_start:char_end])
        offsets = doc.offsets
        fixed = self.counter.special_tokens + doc.prefix_tokens
        exact_start = offsets[start][0] == char_start and (start == 0 or rule == CUTS_TOKENS or doc.at_space(start))
        exact_end = offsets[end - 1][1] == char_end and (end == doc.size or rule == CUTS_TOKENS or doc.at_space(end))
        if exact_start and exact_end:
            return fixed + end - start
        if rule == CUTS_TOKENS:
            return self._count(doc.prefix + doc.text[char_start:char_end])
        inner_start = start if exact_start else next(
            (j for j in range(start + 1, min(end, start + EDGE_SCAN_TOKENS)) if doc.at_space(j)), None)
        if inner_start is None:
            return self._count(doc.prefix + doc.text[char_start:char_end])
        inner_end = end if exact_end else next(
            (j for j in range(end - 1, max(inner_start, end - EDGE_SCAN_TOKENS) - 1, -1) if doc.at_space(j)), None)
        if inner_end is None:
            return self._count(doc.prefix + doc.text[char_start:char_end])
        count = fixed + inner_end - inner_start
        if inner_start != start:
            count += self._count(doc.text[char_start:offsets[inner_start][0]]) - self.counter.special_tokens
        if inner_end != end:
            count += self._count(doc.text[offsets[inner_end][0]:char_end]) - self.counter.special_tokens
        return count

    def _count(self, text: str) -> int:
        return self.counter.counts([text])[0]


def _strip(text: str, start: int, end: int) -> tuple[int, int]:
    """``start..end`` without the whitespace at either edge."""
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end
