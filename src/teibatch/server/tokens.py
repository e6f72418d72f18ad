"""Token counting for backends without a real tokenizer: a documented, deterministic approximation.

TEI counts tokens with the model's tokenizer; ``max_input_length``, truncation, ``/tokenize`` and the
OpenAI ``usage`` all use that one count. The hashing backend has no vocabulary, so this module
defines one rule, used for all four, that lands near a BERT WordPiece count for English text:

* pieces are runs of up to 4 ASCII word characters (``[A-Za-z0-9_]{1,4}``, so a long word is cut
  every 4 characters), or any other single non-space character (punctuation, non-ASCII letters);
* each input gets 2 special tokens, ``[CLS]`` (id 101) first and ``[SEP]`` (id 102) last;
* truncation keeps the first (``right``) or last (``left``) ``max_length - 2`` pieces and cuts the
  text at their byte-exact edges, so the vector is computed on exactly the text that was counted.

Ids are reversible, so token-id inputs embed like the text they came from (TEI decodes them and
re-encodes without special tokens): an ASCII piece is its characters in base 64 plus 1000, any other
character is ``40_000_000 + codepoint``; a flag bit marks a piece glued to the one before (no
whitespace between). Decoding therefore gives back the text with whitespace runs made single spaces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Protocol

import numpy as np

SPECIAL_TOKENS = {0: "[PAD]", 100: "[UNK]", 101: "[CLS]", 102: "[SEP]", 103: "[MASK]"}
CLS_ID = 101
SEP_ID = 102

_PIECE = re.compile(r"[A-Za-z0-9_]{1,4}|\S")
_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_"
_DIGIT = {ch: i + 1 for i, ch in enumerate(_ALPHABET)}
# The same rule over many texts at once (ApproxTokenizer.counts), by code point: which are ASCII word
# characters, and which are whitespace (every character ``str.isspace`` calls one is below U+3001).
_IS_WORD = np.zeros(128, dtype=bool)
_IS_WORD[[ord(ch) for ch in _ALPHABET]] = True
_SPACE_BELOW = 0x3001
_IS_SPACE = np.array([chr(code).isspace() for code in range(_SPACE_BELOW)] + [False])
# Below this many texts one regex a text is cheaper than numpy's fixed costs.
_COUNT_TOGETHER_FROM = 4
_WORD_BASE = 1000
_WORD_GLUE = 1 << 24
_CHAR_BASE = 40_000_000
_CHAR_GLUE = 1 << 21


@dataclass(frozen=True)
class Token:
    """One token as ``/tokenize`` shows it; ``start``/``stop`` are byte offsets, ``None`` for specials."""

    id: int
    text: str
    special: bool
    start: int | None
    stop: int | None


class Tokenizer(Protocol):
    """What the server needs from a tokenizer; the approximation here and a real one both fit.

    ``count`` includes the special tokens an input gets; ``truncate`` returns a prefix (``right``)
    or suffix (``left``) of the text whose count is at most ``max_tokens``.
    """

    def count(self, text: str) -> int: ...

    def counts(self, texts: Sequence[str]) -> list[int]:
        """``count`` of each of ``texts`` (a request's inputs), computed together where that is cheaper."""
        ...

    def truncate(self, text: str, max_tokens: int, direction: str) -> str: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[Token]: ...

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str: ...


def _piece_id(piece: str, glued: bool) -> int:
    if len(piece) <= 4 and all(ch in _DIGIT for ch in piece):
        code = 0
        for i in range(4):
            code = code * 64 + (_DIGIT[piece[i]] if i < len(piece) else 0)
        return _WORD_BASE + code + (_WORD_GLUE if glued else 0)
    return _CHAR_BASE + ord(piece) + (_CHAR_GLUE if glued else 0)


def _id_piece(token_id: int) -> tuple[str, bool] | None:
    """The piece an id stands for and whether it is glued to the previous one; None if unknown."""
    if _WORD_BASE <= token_id < _WORD_BASE + 2 * _WORD_GLUE:
        glued, code = divmod(token_id - _WORD_BASE, _WORD_GLUE)
        chars = []
        for shift in (18, 12, 6, 0):
            digit = (code >> shift) & 63
            if digit:
                chars.append(_ALPHABET[digit - 1])
        return ("".join(chars), bool(glued)) if chars else None
    if _CHAR_BASE <= token_id < _CHAR_BASE + 2 * _CHAR_GLUE:
        glued, code = divmod(token_id - _CHAR_BASE, _CHAR_GLUE)
        if code > 0x10FFFF or 0xD800 <= code <= 0xDFFF:
            return None
        return chr(code), bool(glued)
    return None


def byte_offsets(text: str) -> list[int] | None:
    """Byte offset of each character boundary, or None when the text is ASCII (chars == bytes)."""
    if text.isascii():
        return None
    return list(accumulate((len(ch.encode("utf-8", "surrogatepass")) for ch in text), initial=0))


class ApproxTokenizer:
    """The deterministic approximation described in this module's docstring."""

    special_tokens = 2

    def count(self, text: str) -> int:
        """Tokens of ``text`` with ``[CLS]`` and ``[SEP]``; this is what limits and ``usage`` see."""
        return len(_PIECE.findall(text)) + self.special_tokens

    def counts(self, texts: Sequence[str]) -> list[int]:
        """:meth:`count` of each of ``texts``, the same numbers, computed for all of them at once.

        A server counts every input of a request; one regex scan a text was a tenth of a busy
        server's CPU. Here a piece starts at every non-space character that is not an ASCII word
        character, and at every fourth character of a run of them (0, 4, 8, ... from its start), and
        the texts' starts are counted in one pass over all their code points (joined by newlines,
        which are no piece and keep runs apart).
        """
        if len(texts) < _COUNT_TOGETHER_FROM:
            return [self.count(text) for text in texts]
        points = np.frombuffer(("\n".join(texts) + "\n").encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        word = _IS_WORD[np.minimum(points, 127)]  # U+007F is no word character: it stands for every one above
        other = ~(word | _IS_SPACE[np.minimum(points, _SPACE_BELOW)])
        run_start = word.copy()
        run_start[1:] &= ~word[:-1]
        at = np.arange(len(points))
        run_began = np.maximum.accumulate(np.where(run_start, at, 0))
        starts = other | (word & ((at - run_began) % 4 == 0))
        lengths = np.fromiter((len(text) + 1 for text in texts), dtype=np.int64, count=len(texts))
        first = np.concatenate(([0], np.cumsum(lengths)[:-1]))
        return (np.add.reduceat(starts.astype(np.int64), first) + self.special_tokens).tolist()

    def spans(self, text: str) -> list[tuple[int, int]]:
        """Character spans of the pieces of ``text``, special tokens left out (what a chunker cuts by)."""
        return [match.span() for match in _PIECE.finditer(text)]

    def truncate(self, text: str, max_tokens: int, direction: str) -> str:
        """Cut ``text`` so that ``count`` of the result is at most ``max_tokens``."""
        keep = max(0, max_tokens - self.special_tokens)
        if keep == 0:
            return ""
        if direction == "left":
            spans = [m.start() for m in _PIECE.finditer(text)]
            if len(spans) <= keep:
                return text
            return text[spans[-keep]:]
        end = 0
        for i, match in enumerate(_PIECE.finditer(text)):
            if i == keep:
                return text[:end]
            end = match.end()
        return text

    def encode(self, text: str, add_special_tokens: bool = True) -> list[Token]:
        """Every token with its id and byte offsets, as ``/tokenize`` returns them."""
        byte_at = byte_offsets(text)
        tokens: list[Token] = []
        if add_special_tokens:
            tokens.append(Token(CLS_ID, SPECIAL_TOKENS[CLS_ID], True, None, None))
        previous_end = -1
        for match in _PIECE.finditer(text):
            start, stop = match.span()
            piece = match.group()
            glued = start == previous_end
            previous_end = stop
            if byte_at is not None:
                start, stop = byte_at[start], byte_at[stop]
            tokens.append(Token(_piece_id(piece, glued), piece, False, start, stop))
        if add_special_tokens:
            tokens.append(Token(SEP_ID, SPECIAL_TOKENS[SEP_ID], True, None, None))
        return tokens

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text for ``ids``: pieces joined by one space unless glued; unknown ids read ``[UNK]``."""
        parts: list[str] = []
        for token_id in ids:
            if token_id in SPECIAL_TOKENS:
                if skip_special_tokens:
                    continue
                piece, glued = SPECIAL_TOKENS[token_id], False
            else:
                found = _id_piece(token_id)
                piece, glued = found if found is not None else ("[UNK]", False)
            if parts and not glued:
                parts.append(" ")
            parts.append(piece)
        return "".join(parts)
