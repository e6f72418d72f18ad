"""Ray orchestration: plan the shards, run them on the servers, commit them, report."""

from teibatch.pipeline.progress import Reporter, reporter_for
from teibatch.pipeline.run import run_job
from teibatch.pipeline.summary import RunSummary

__all__ = ["Reporter", "RunSummary", "reporter_for", "run_job"]
