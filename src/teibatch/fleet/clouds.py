"""The GPU clouds as ``teibatch fleet list`` and ``fleet sweep`` see them: what the clouds' APIs show.

The ledger knows what a run asked for; the clouds know what exists. For every cloud that some run in
the ledger used, the cloud's API is asked for the instances named ``teibatch-<run id>-<n>``, so an
instance the ledger does not show as live (its create call timed out, a driver was killed between two
writes) is listed and swept too. A cloud no run used is never asked (no key needed, no call made).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

from teibatch.errors import FleetError, JobSpecError
from teibatch.fleet.base import Provider
from teibatch.fleet.hosted import ContainerProvider
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.providers.lambdacloud import LambdaApi, LambdaProvider
from teibatch.fleet.providers.runpod import RunPodApi, RunPodProvider
from teibatch.fleet.providers.vast import VastApi, VastProvider
from teibatch.fleet.rental import NAME_PREFIX, CloudApi, CloudInstance, slot_of

log = logging.getLogger(__name__)

#: cloud provider name → how to open its API (credentials from the environment or its config file)
API_OPENERS: dict[str, Callable[[], CloudApi]] = {"lambda": LambdaApi, "runpod": RunPodApi, "vast": VastApi}


@dataclass(frozen=True)
class CloudEntry:
    """A live instance a cloud's API lists, and what the ledger says of it."""

    provider: str
    run_id: str | None
    instance: str
    cloud_id: str
    status: str
    address: str | None
    price_per_hour: float | None
    in_ledger: str   # the ledger's state of it, or "missing"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def run_of(name: str) -> str | None:
    """The run id in an instance name ``teibatch-<run id>-<n>`` or ``…-<n>.<attempt>`` (``None`` for other names)."""
    if not name.startswith(NAME_PREFIX):
        return None
    run, _, index = slot_of(name)[len(NAME_PREFIX):].rpartition("-")
    return run if run and index.isdigit() else None


def clouds_used(records: Iterable[Mapping[str, Any]]) -> list[str]:
    """The cloud providers some run of the ledger used."""
    return sorted({str(r.get("provider")) for r in records if r.get("provider") in API_OPENERS})


def cloud_entries(ledger: Ledger) -> tuple[list[CloudEntry], list[str]]:
    """Every live ``teibatch-`` instance of the clouds the ledger's runs used; and the clouds that could not
    be asked, with why."""
    records = ledger.runs()
    states = {(str(r.get("run_id")), name): str(entry.get("state", "unknown"))
              for r in records for name, entry in r.get("instances", {}).items()}
    entries, problems = [], []
    for cloud in clouds_used(records):
        try:
            api = API_OPENERS[cloud]()
        except JobSpecError as exc:
            problems.append(f"{cloud}: {exc}")
            continue
        try:
            found: list[CloudInstance] = api.list(NAME_PREFIX)
        except FleetError as exc:
            problems.append(f"{cloud}: {exc}")
            continue
        finally:
            api.close()
        for instance in found:
            run = run_of(instance.name)
            entries.append(CloudEntry(cloud, run, instance.name, instance.id, instance.status, instance.address,
                                      instance.price_per_hour,
                                      states.get((run or "", slot_of(instance.name)), "missing")))
    return entries, problems


def restore(record: Mapping[str, Any], ledger: Ledger) -> Provider | None:
    """The provider of a recorded run, holding its instances (``None``: nothing a sweep can take back).

    Raises :class:`JobSpecError` when the run's cloud has no API key in this environment.
    """
    kind = record.get("config", {}).get("kind")
    if kind == "container":
        return ContainerProvider.from_ledger(record, ledger)
    if kind == "lambda":
        return LambdaProvider.restore(record, ledger, LambdaApi())
    if kind == "runpod":
        return RunPodProvider.restore(record, ledger, RunPodApi())
    if kind == "vast":
        return VastProvider.restore(record, ledger, VastApi())
    return None
