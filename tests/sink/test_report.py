"""Which run ``teibatch report`` shows when none is named: the latest that did work."""

from __future__ import annotations

from pathlib import Path

import pytest

from teibatch.sink import OutputStore, RunChoice, choose_run, write_report
from teibatch.sink.report import MAX_RUNS_SEARCHED

COMMITTED = {"status": "done", "shards": {"total": 5, "skipped_committed": 0, "committed": 5, "failed": 0}}
NOTHING_TO_DO = {"status": "done", "shards": {"total": 5, "skipped_committed": 5, "committed": 0, "failed": 0}}
FAILED = {"status": "incomplete", "shards": {"total": 5, "skipped_committed": 5, "committed": 0, "failed": 0}}


def runs(tmp_path: Path, *reports: dict[str, object]) -> OutputStore:
    """An output whose runs wrote ``reports``, oldest first (ids by start time, as runs name them)."""
    store = OutputStore(str(tmp_path / "out"))
    for index, report in enumerate(reports):
        write_report(store, f"20260101T{index:06d}Z-aaaaaa", report)
    return store


def run_id(index: int) -> str:
    return f"20260101T{index:06d}Z-aaaaaa"


@pytest.mark.parametrize(("reports", "chosen", "why"), [
    pytest.param([NOTHING_TO_DO, COMMITTED], 1, "the latest run", id="the-latest-did-work"),
    pytest.param([COMMITTED, NOTHING_TO_DO], 0, f"the latest run that committed shards or failed; the newer run "
                 f"{run_id(1)} found nothing to do", id="after-a-resume-with-nothing-to-do"),
    pytest.param([COMMITTED, NOTHING_TO_DO, NOTHING_TO_DO], 0, f"the latest run that committed shards or failed; "
                 f"the 2 newer runs, up to {run_id(2)}, found nothing to do", id="after-two"),
    pytest.param([COMMITTED, FAILED], 1, "the latest run", id="a-failed-run-did-work"),
    pytest.param([NOTHING_TO_DO, NOTHING_TO_DO], 1, "the latest run; no run committed shards or failed",
                 id="none-did-work"),
    pytest.param([COMMITTED, "not a report", NOTHING_TO_DO], 0, f"the latest run that committed shards or failed; "
                 f"the 2 newer runs, up to {run_id(2)}, found nothing to do", id="a-damaged-report-is-passed-over"),
])
def test_the_latest_run_that_did_work_is_chosen_and_why(tmp_path: Path, reports: list[dict[str, object]],
                                                         chosen: int, why: str) -> None:
    assert choose_run(runs(tmp_path, *reports)) == RunChoice(run_id(chosen), why)


def test_no_run_no_choice_and_the_search_is_bounded(tmp_path: Path) -> None:
    assert choose_run(OutputStore(str(tmp_path / "empty"))) is None
    store = runs(tmp_path, COMMITTED, *[NOTHING_TO_DO] * MAX_RUNS_SEARCHED)
    why = f"the latest run; none of the latest {MAX_RUNS_SEARCHED} runs committed shards or failed"
    assert choose_run(store) == RunChoice(run_id(MAX_RUNS_SEARCHED), why)
