"""The run's fleet: the job's provider (built by :mod:`teibatch.pipeline.fleet_from_job`), its servers for one run,
and what the ledger recorded of them, for the run report."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

from teibatch.endpoint import Endpoint
from teibatch.errors import FleetError
from teibatch.fleet.base import LaunchSpec, Provider
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.cost import run_cost
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.lifecycle import ExportPlan, session
from teibatch.job import JobSpec
from teibatch.pipeline.fleet_from_job import provider_for


def job_provider(job: JobSpec) -> Provider:
    """The provider the job asks for, configured; launches nothing yet (job errors raise here, before any work)."""
    return provider_for(job.servers, model_id=job.model.id, payload_limit=job.client.payload_limit,
                        export_to=job.export.to, waive_export=job.export.waive,
                        import_from=job.export.import_from)


def fleet_session(job: JobSpec, provider: Provider, run_id: str) -> AbstractContextManager[list[Endpoint]]:
    """The provider's servers for one run: up, then down, export and destroy however the run ends."""
    export = job.export
    to = export.to
    if to and "://" not in to:
        to = str(Path(to).expanduser().absolute())
    spec = LaunchSpec(run_id=run_id, job_name=job.name, max_runtime=job.limits.max_runtime,
                      import_from=export.import_from, export_to=to)
    return session(provider, spec, ExportPlan(to=to, waive=export.waive, timeout=export.timeout,
                                              storage_options=dict(export.storage_options)))


def fleet_record(provider: Provider, run_id: str, started_at: str) -> tuple[dict[str, Any] | None,
                                                                             list[dict[str, Any]]]:
    """What the ledger says of this run's instances, read once after teardown: what they cost
    (``fleet/cost.py``; ``None`` unless the provider rents) and every step recorded for each
    (requested, running, healthy, removed, destroyed...) as run events, ``t`` in seconds since
    ``started_at`` (ISO), oldest first. Nothing for a provider without a ledger."""
    ledger = getattr(provider, "ledger", None)
    try:
        record = ledger.load(run_id) if isinstance(ledger, Ledger) else None
    except FleetError:  # an unreadable ledger costs the report these sections, not the run
        return None, []
    if record is None:
        return None, []
    rule = billing_rules().get(provider.name)
    origin = datetime.fromisoformat(started_at)
    events = [{"t": round((datetime.fromisoformat(step["at"]) - origin).total_seconds(), 3),
               "event": f"instance_{step['state']}", "message": f"{name}: {step['state']}", "instance": name}
              for name, entry in sorted(record.get("instances", {}).items()) for step in entry.get("steps", [])]
    return (run_cost(record, rule) if rule is not None else None), sorted(events, key=lambda event: event["t"])
