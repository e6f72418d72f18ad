"""Cutting a text into sentences and paragraphs, the units the chunker packs whole.

Each function returns ``(start, end)`` character offsets into the text, in order, of units that
neither start nor end with whitespace and are never empty; only whitespace lies between two units.

* A **paragraph** ends at a blank line (a line break, optional spaces or tabs, a line break).
* A **sentence** ends where a paragraph ends, and after a run of ``.``, ``!``, ``?`` or ``…`` (with
  the closing quotes and brackets that follow it) when whitespace comes next and the next word does
  not start with a lowercase letter, so ``e.g. this`` and ``3.5`` stay whole (``Dr. Smith`` does not);
  and after ``。``, ``！`` or ``？`` (with their closing quotes and brackets) whatever comes next,
  since Chinese and Japanese put no space between sentences. A single line break ends nothing.

A deliberately simple rule, fast and without a language model: a wrong cut only moves a chunk's
edge, since the chunker packs several sentences into each chunk.
"""

from __future__ import annotations

import re

_PARAGRAPH_BREAK = re.compile(r"\n[ \t\r\f\v]*\n")
_SENTENCE_END = re.compile(
    r"""[.!?…]+["'”’»)\]]*(?=\s)"""        # Latin terminators, only before whitespace
    r"""|[。！？]+["'”’」』)）\]]*"""        # CJK terminators, anywhere
    r"""|\n[ \t\r\f\v]*\n""")              # a paragraph break
_NEXT_WORD = re.compile(r"\S")


def split_paragraphs(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """The paragraphs of ``text[start:end]``, as offsets into ``text``."""
    stop = len(text) if end is None else end
    cuts = [match.end() for match in _PARAGRAPH_BREAK.finditer(text, start, stop)]
    return _units(text, start, stop, cuts)


def split_sentences(text: str, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """The sentences of ``text[start:end]``, as offsets into ``text``."""
    stop = len(text) if end is None else end
    cuts = []
    for match in _SENTENCE_END.finditer(text, start, stop):
        if match.group()[0] in ".!?…":
            following = _NEXT_WORD.search(text, match.end(), stop)
            if following is not None and text[following.start()].islower():
                continue
        cuts.append(match.end())
    return _units(text, start, stop, cuts)


def _units(text: str, start: int, stop: int, cuts: list[int]) -> list[tuple[int, int]]:
    units = []
    for begin, finish in zip([start, *cuts], [*cuts, stop], strict=True):
        piece = text[begin:finish]
        left = piece.lstrip()
        if left:
            first = begin + len(piece) - len(left)
            units.append((first, first + len(left.rstrip())))
    return units
