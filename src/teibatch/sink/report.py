"""Run reports: ``runs/<run id>.json``, one per run, never overwritten; which run to show."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from teibatch.sink.store import OutputStore

RUNS_DIR = "runs"
MAX_RUNS_SEARCHED = 50
"""Run reports :func:`choose_run` reads at most, newest first, looking for one that did work."""


@dataclass(frozen=True)
class RunChoice:
    """The run a command shows when none is named, and ``why`` that one (for a person to read)."""

    run_id: str
    why: str


def write_report(store: OutputStore, run_id: str, report: dict[str, Any]) -> str:
    """Write the report of run ``run_id``; return its relative path."""
    relative = f"{RUNS_DIR}/{run_id}.json"
    store.write_json(relative, report)
    return relative


def run_ids(store: OutputStore) -> list[str]:
    """The ids of the runs that wrote a report, oldest first (run ids start with their UTC start time)."""
    return [name.removesuffix(".json") for name in store.list(RUNS_DIR) if name.endswith(".json")]


def latest_report(store: OutputStore) -> dict[str, Any] | None:
    """The newest run report, or ``None``."""
    ids = run_ids(store)
    return store.read_json(f"{RUNS_DIR}/{ids[-1]}.json") if ids else None


def did_work(report: object) -> bool:
    """Whether a run report tells of work: shards committed, or a run that did not finish.

    A run that found every shard committed (a scheduled resume with nothing to do) did none.
    """
    if not isinstance(report, dict):
        return False
    shards = report.get("shards")
    committed = shards.get("committed") if isinstance(shards, dict) else None
    return report.get("status") != "done" or (isinstance(committed, int) and committed > 0)


def choose_run(store: OutputStore) -> RunChoice | None:
    """The run to show when none is named: the newest that did work (:func:`did_work`), else the newest.

    ``teibatch report OUTPUT`` after a cron run with nothing to do shows the last run that embedded
    something, or failed, instead of an empty one. Reads at most :data:`MAX_RUNS_SEARCHED` reports.
    """
    ids = run_ids(store)
    if not ids:
        return None
    newest = ids[-1]
    searched = ids[::-1][:MAX_RUNS_SEARCHED]
    for skipped, run_id in enumerate(searched):
        if did_work(store.read_json(f"{RUNS_DIR}/{run_id}.json")):
            if not skipped:
                return RunChoice(run_id, "the latest run")
            newer = f"the newer run {newest}" if skipped == 1 else f"the {skipped} newer runs, up to {newest},"
            return RunChoice(run_id, f"the latest run that committed shards or failed; {newer} found nothing to do")
    among = "no run" if len(searched) == len(ids) else f"none of the latest {len(searched)} runs"
    return RunChoice(newest, f"the latest run; {among} committed shards or failed")
