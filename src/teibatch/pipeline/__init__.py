"""Ray orchestration: plan the shards, run them on the servers, commit them, report."""

from teibatch.pipeline.progress import Reporter, reporter_for
from teibatch.pipeline.run import RunSummary, run_job

__all__ = ["Reporter", "RunSummary", "reporter_for", "run_job"]
