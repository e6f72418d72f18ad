"""Strict CSV reading: legitimate quoting reads as before, a misplaced quote stops at its line."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli import main
from teibatch.corpus.csvfile import csv_rows
from teibatch.corpus.rows import Malformed, ReadPosition, Unreadable
from teibatch.errors import CorpusMismatch


def rows(data: bytes, start: int = 0, stop: int | None = None, *, reject: bool = False,
         delimiter: str = ",") -> list[tuple[int, Any]]:
    """``(row_number, row)`` pairs; :func:`lines` gives each row's line."""
    return [(number, row) for number, _, row in
            csv_rows(io.BytesIO(data), "c.csv", delimiter, start, stop, ReadPosition(), reject_rest=reject)]


def lines(data: bytes) -> list[int | None]:
    return [line for _, line, _ in csv_rows(io.BytesIO(data), "c.csv", ",", 0, None, ReadPosition())]


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        pytest.param(b'id,text\na,"two\nlines"\nb,x\n', [{"id": "a", "text": "two\nlines"}, {"id": "b", "text": "x"}],
                     id="multi-line-quoted"),
        pytest.param(b'id,text\r\na,"crlf\r\ninside"\r\nb,x\r\n',
                     [{"id": "a", "text": "crlf\r\ninside"}, {"id": "b", "text": "x"}], id="crlf"),
        pytest.param(b"id,text\ra,x\rb,y\r", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}],
                     id="lone-cr-line-ends"),
        pytest.param(b'\xef\xbb\xbfid,text\na,"say ""hi"""\n', [{"id": "a", "text": 'say "hi"'}], id="bom-and-escaped"),
        pytest.param(b'id,text\na,5" screen\n', [{"id": "a", "text": '5" screen'}], id="quote-inside-unquoted"),
        pytest.param(b"id,text\n\na,x\n\n\nb,y", [{"id": "a", "text": "x"}, {"id": "b", "text": "y"}],
                     id="blank-lines-no-final-newline"),
        pytest.param(b"id,text,n\na,x\nb,y,1,extra\n", [{"id": "a", "text": "x"}, {"id": "b", "text": "y", "n": "1"}],
                     id="short-and-long-rows"),
    ],
)
def test_well_formed_csv_reads_as_before(data: bytes, expected: list[dict[str, str]]) -> None:
    assert [row for _, row in rows(data)] == expected


def test_a_thousand_rows_with_long_multi_line_cells_are_not_refused() -> None:
    body = "".join(f'r{i},"{"paragraph " * 50}\n{"more " * 200}\n"\n' for i in range(1000))
    read = rows(("id,text\n" + body).encode())
    assert len(read) == 1000
    assert all(row["text"].count("\n") == 2 for _, row in read)


def unclosed(total: int = 1001, bad_row: int = 11) -> bytes:
    """``total`` data rows; row ``bad_row`` (1-based) opens a quote that never closes."""
    lines = ["id,text"] + [f"r{i},row {i}" for i in range(1, total + 1)]
    lines[bad_row] = f'r{bad_row},"row {bad_row} with a stray quote'
    return ("\n".join(lines) + "\n").encode()


def test_unclosed_quote_stops_at_the_line_it_opens_on() -> None:
    with pytest.raises(Unreadable) as caught:
        rows(unclosed())
    error = caught.value
    assert (error.file, error.line) == ("c.csv", 12)  # header is line 1, row 11 is line 12
    assert "never closes" in error.problem and "line 1002" in error.problem


def test_quote_closed_in_the_wrong_place_stops_at_the_record() -> None:
    data = b'id,text\na,fine\nb,"opens here\nc,fine\nd,"quoted" and more\ne,x\n'
    with pytest.raises(Unreadable, match="not valid CSV") as caught:
        rows(data)
    assert caught.value.line == 3  # "b,\"opens here" is line 3; the error shows on line 5


def test_reject_rest_rejects_every_remaining_line() -> None:
    read = rows(unclosed(), reject=True)
    assert len(read) == 1001
    assert [n for n, _ in read] == list(range(1001))
    assert all(isinstance(row, dict) for _, row in read[:10])
    bad = [row for _, row in read[10:]]
    assert all(isinstance(row, Malformed) for row in bad)
    assert bad[0].detail.startswith("c.csv#10 (line 12): ") and "never closes" in bad[0].detail
    assert bad[-1].detail.startswith("c.csv#1000 (line 1002): ")


@pytest.mark.parametrize(("start", "stop"), [(0, 300), (300, 600), (600, 1001), (5, 15), (1000, 1001)])
def test_reject_rest_numbers_rows_the_same_in_any_range(start: int, stop: int) -> None:
    whole = rows(unclosed(), reject=True)
    assert rows(unclosed(), start, stop, reject=True) == whole[start:stop]


def test_non_utf8_byte_names_its_line_and_column() -> None:
    with pytest.raises(Unreadable, match=r"byte 0xe9 at column 6") as caught:
        rows(b"id,text\na,ok\nb,caf\xe9\n")
    assert caught.value.line == 3


def test_tab_delimited() -> None:
    assert rows(b'id\ttext\na\t"x\ty"\n', delimiter="\t") == [(0, {"id": "a", "text": "x\ty"})]


def test_each_row_carries_the_line_its_record_starts_on() -> None:
    assert lines(b'id,text\n\na,"two\nlines"\nb,x\n') == [3, 5]


def test_a_column_named_twice_in_the_header_is_refused_naming_both_positions() -> None:
    with pytest.raises(CorpusMismatch, match=r"c.csv:1: the header names column 'Body Text' twice, as columns 2 and 5"):
        rows(b"Doc ID,Body Text,x,,Body Text\nd1,first,y,,second\n", reject=True)


def test_unnamed_columns_may_repeat() -> None:
    assert rows(b"id,text,,\na,b,c,d\n") == [(0, {"id": "a", "text": "b", "": "d"})]


@pytest.mark.parametrize("command", [pytest.param("validate", id="validate"), pytest.param("run", id="run")])
def test_a_job_on_a_csv_with_a_duplicated_header_exits_2_before_any_work(tmp_path: Path, command: str) -> None:
    (tmp_path / "docs.csv").write_text("Doc ID,Body Text,x,,Body Text\nd1,first,y,,second\nd2,third,z,,fourth\n")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({
        "corpus": {"path": str(tmp_path / "docs.csv"), "id_field": "Doc ID", "text_field": "Body Text"},
        "servers": {"provider": "local", "count": 1}, "output": {"path": str(tmp_path / "out")}}))
    result = CliRunner().invoke(main, [command, str(job)])
    assert result.exit_code == 2, result.output
    assert "docs.csv:1: the header names column 'Body Text' twice, as columns 2 and 5" in result.stderr
    assert not (tmp_path / "out" / "vectors").exists()
