"""The state of an output, for ``teibatch status``: shards done and pending, documents, last run."""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from teibatch.errors import SinkError
from teibatch.sink.lock import OutputLock
from teibatch.sink.manifest import MANIFEST, Manifest
from teibatch.sink.parts import part_name
from teibatch.sink.presence import check_parts
from teibatch.sink.report import latest_report
from teibatch.sink.store import OutputStore


def output_status(store: OutputStore) -> dict[str, Any]:
    """Shards planned / committed / pending, vectors and rejects in the current view, the last run, and
    the run writing it now (``writing``: the holder of its lock, else ``None``).

    The committed parts are checked against the files (``sink/presence.py``): ``documents.vectors`` counts
    the rows of the parts that are there, ``parts`` names those missing or not the size recorded. A lock
    whose holder is gone (a killed run) is ``stale_lock``, not ``writing``: the next run takes it over.
    """
    manifest = Manifest.load(store)
    if manifest is None:
        raise SinkError(f"{store.url} has no {MANIFEST}: no run has written there yet")
    committed = [sid for sid in manifest.planned if sid in manifest.shards]
    report = latest_report(store) or {}
    holder = OutputLock(store, "").holder()
    stale = holder is not None and holder.stale()
    check = check_parts(store, manifest, committed)
    return {
        "output": store.url,
        "job": manifest.job_name,
        "model_id": manifest.info.get("model_id"),
        "dimension": manifest.info.get("dimension"),
        "shards": {"planned": len(manifest.planned), "committed": len(committed),
                   "pending": len(manifest.pending),
                   "stale": len(set(manifest.shards) - set(manifest.planned))},
        "documents": {"vectors": check.rows, "rejects": manifest.rejects},
        "parts": {"missing": [part_name(sid) for sid in check.missing],
                  "wrong_size": [part_name(sid) for sid in check.wrong_size]},
        "runs": len(manifest.runs),
        "last_run": {key: report.get(key) for key in ("run_id", "status", "documents", "timings", "errors")}
        if report else None,
        "writing": asdict(holder) if holder is not None and not stale else None,
        "stale_lock": asdict(holder) if holder is not None and stale else None,
    }
