from __future__ import annotations

import pytest

from teibatch.corpus.text_units import split_paragraphs, split_sentences


def texts_of(text: str, units: list[tuple[int, int]]) -> list[str]:
    return [text[start:end] for start, end in units]


@pytest.mark.parametrize(("text", "expected"), [
    pytest.param("One. Two! Three? Four", ["One.", "Two!", "Three?", "Four"], id="terminators"),
    pytest.param("He said \"stop.\" Then left.", ["He said \"stop.\"", "Then left."], id="closing-quote"),
    pytest.param("(Like this.) And more…  Done", ["(Like this.)", "And more…", "Done"], id="bracket-ellipsis"),
    pytest.param("Use e.g. this one. Pi is 3.14 here.", ["Use e.g. this one.", "Pi is 3.14 here."],
                 id="lowercase-and-decimals-stay"),
    pytest.param("Dr. Smith came.", ["Dr.", "Smith came."], id="abbreviation-before-a-name-splits"),
    pytest.param("日本語です。次の文！最後？", ["日本語です。", "次の文！", "最後？"], id="cjk-without-spaces"),
    pytest.param("「はい。」と言った。", ["「はい。」", "と言った。"], id="cjk-closing-bracket"),
    pytest.param("A heading\n\nThe body text\nwraps here", ["A heading", "The body text\nwraps here"],
                 id="paragraph-break-but-not-line-break"),
    pytest.param("  \n\t ", [], id="whitespace-only"),
    pytest.param("", [], id="empty"),
    pytest.param("no end", ["no end"], id="no-terminator"),
])
def test_sentences(text: str, expected: list[str]) -> None:
    assert texts_of(text, split_sentences(text)) == expected


def test_paragraphs() -> None:
    text = "\n\nFirst para\nstill first.\n \t\nSecond.\r\n\r\n\n\nThird  \n"
    assert texts_of(text, split_paragraphs(text)) == ["First para\nstill first.", "Second.", "Third"]


def test_units_of_a_slice_are_offsets_into_the_whole_text() -> None:
    text = "Skip this. Keep one. Keep two.\n\nAnd this."
    start = text.index("Keep")
    end = text.index("\n")
    assert texts_of(text, split_sentences(text, start, end)) == ["Keep one.", "Keep two."]
    assert texts_of(text, split_paragraphs(text, start)) == ["Keep one. Keep two.", "And this."]
