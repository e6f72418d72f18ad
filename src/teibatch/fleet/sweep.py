"""``teibatch fleet sweep``: find in the ledger what killed runs left, and finish it.

A run is swept when some of its instances are not ``destroyed`` — in the ledger, or in the list of
a GPU cloud's API, found there by name (:mod:`teibatch.fleet.clouds`) — and its driver no longer runs
(``force`` sweeps it anyway). Sweeping a run is the same :func:`~teibatch.fleet.lifecycle.finish` a
run ends with: remove its containers (found on each host by the run label), export the volumes to
the run's ``export.to`` (credentials from the environment: the ledger holds none), then destroy what
may be destroyed. Sweeping again is harmless.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from teibatch.errors import ExportFailed, FleetError, JobSpecError
from teibatch.fleet.base import InstanceState
from teibatch.fleet.clouds import API_OPENERS, cloud_entries, restore
from teibatch.fleet.ledger import Ledger, driver_alive
from teibatch.fleet.lifecycle import ExportPlan, finish


@dataclass(frozen=True)
class SweepResult:
    """What a sweep did with one run: ``destroyed``, ``kept`` (export not verified), ``failed``,
    ``skipped`` (its driver still runs), or ``would sweep`` (dry run)."""

    run_id: str
    provider: str
    instances: tuple[str, ...]
    action: str
    detail: str = ""

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "instances": list(self.instances)}


def sweep(ledger: Ledger | None = None, *, run_id: str | None = None, dry_run: bool = False,
          waive_export: bool = False, force: bool = False) -> list[SweepResult]:
    """Finish every run the ledger shows unfinished, or whose instances a cloud still lists (or just
    ``run_id``); one result per run."""
    ledger = ledger or Ledger()
    results = []
    live, problems = cloud_entries(ledger)
    for problem in problems:
        results.append(SweepResult("?", problem.partition(":")[0], (), "failed",
                                   f"could not ask the cloud for leftovers: {problem}"))
    for record in ledger.runs():
        rid = str(record.get("run_id", "?"))
        if run_id and rid != run_id:
            continue
        left = tuple(name for name, entry in record.get("instances", {}).items()
                     if entry.get("state") != InstanceState.DESTROYED.value)
        in_cloud = tuple(e.instance for e in live if e.run_id == rid and e.instance not in left)
        left += in_cloud
        if not left:
            continue
        provider_name = str(record.get("provider", "?"))
        if driver_alive(record.get("driver", {})) and not force:
            pid = record.get("driver", {}).get("pid")
            results.append(SweepResult(rid, provider_name, left, "skipped",
                                       f"its driver (pid {pid}) still runs; --force sweeps it anyway"))
            continue
        if record.get("config", {}).get("kind") not in ("container", *API_OPENERS):
            results.append(SweepResult(rid, provider_name, left, "skipped", "nothing this provider can sweep"))
            continue
        if dry_run:
            results.append(SweepResult(rid, provider_name, left, "would sweep",
                                       f"export to {record.get('export_to')}" if record.get("export_to") else ""))
            continue
        try:
            provider = restore(record, ledger)
            assert provider is not None
            finish(provider, ExportPlan(to=record.get("export_to"), waive=waive_export))
        except ExportFailed as exc:
            results.append(SweepResult(rid, provider_name, left, "kept", str(exc)))
        except (FleetError, JobSpecError) as exc:
            results.append(SweepResult(rid, provider_name, left, "failed", str(exc)))
        else:
            results.append(SweepResult(rid, provider_name, left, "destroyed"))
    return results
