"""Ray orchestration: plan the shards, run them on the servers, commit them, report.

The names below load on first use, so that a Ray worker that unpickles a shard task or a sender
imports only what those need (not the driver's fleet, job-file and cloud modules).
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "Reporter": "teibatch.pipeline.progress",
    "RunSummary": "teibatch.pipeline.summary",
    "reporter_for": "teibatch.pipeline.progress",
    "run_job": "teibatch.pipeline.run",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'teibatch.pipeline' has no attribute {name!r}")
    return getattr(import_module(_EXPORTS[name]), name)
