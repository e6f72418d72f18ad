"""Ray orchestration: plan the shards, run them on the servers, commit them, report.

The names below load on first use, so that a Ray worker that unpickles a shard task or a sender
imports only what those need (not the driver's fleet, job-file and cloud modules).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from teibatch.lazy import lazy_getattr

if TYPE_CHECKING:  # the same names, eagerly, for type checkers
    from teibatch.pipeline.progress import Reporter, reporter_for
    from teibatch.pipeline.run import run_job
    from teibatch.pipeline.summary import RunSummary

_EXPORTS = {
    "Reporter": "teibatch.pipeline.progress",
    "RunSummary": "teibatch.pipeline.summary",
    "reporter_for": "teibatch.pipeline.progress",
    "run_job": "teibatch.pipeline.run",
}

__all__ = [
    "Reporter",
    "RunSummary",
    "reporter_for",
    "run_job",
]

__getattr__ = lazy_getattr(__name__, _EXPORTS)
