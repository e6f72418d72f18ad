"""Run reports: ``runs/<run id>.json``, one per run, never overwritten."""

from __future__ import annotations

from typing import Any

from teibatch.sink.store import OutputStore

RUNS_DIR = "runs"


def write_report(store: OutputStore, run_id: str, report: dict[str, Any]) -> str:
    """Write the report of run ``run_id``; return its relative path."""
    relative = f"{RUNS_DIR}/{run_id}.json"
    store.write_json(relative, report)
    return relative


def latest_report(store: OutputStore) -> dict[str, Any] | None:
    """The newest run report (run ids sort by start time), or ``None``."""
    names = [name for name in store.list(RUNS_DIR) if name.endswith(".json")]
    return store.read_json(f"{RUNS_DIR}/{names[-1]}") if names else None
