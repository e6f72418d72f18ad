"""What a run's rented instances cost, from the ledger: price at rent time × rented time, billed.

Each instance's ledger entry holds the price per hour the cloud quoted when it was rented and the
time of every step; the rented time runs from its ``requested`` step (the create call) to its
``destroyed`` step, or to its ``lost`` step when the cloud took it back mid-run (or to now for one not
destroyed yet), rounded up by the cloud's billing rule.
It is what the cloud will charge, as far as the client can tell: the invoice is the truth.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from teibatch.fleet.catalog import BillingRule


@dataclass(frozen=True)
class InstanceCost:
    name: str
    gpu: str | None
    price_per_hour: float
    seconds: float
    billed_seconds: int
    lost: bool = False

    @property
    def cost(self) -> float:
        return self.price_per_hour * self.billed_seconds / 3600


def run_cost(record: dict[str, Any], billing: BillingRule) -> dict[str, Any] | None:
    """The cost in USD per instance and in total of the run whose ledger ``record`` this is, or
    ``None`` when it rented nothing with a price."""
    instances = [cost for name, entry in sorted(record.get("instances", {}).items())
                 if (cost := _instance_cost(name, entry, billing)) is not None]
    if not instances:
        return None
    return {"currency": "USD", "total": round(sum(i.cost for i in instances), 4),
            "billing": {"increment_s": billing.increment_s, "minimum_s": billing.minimum_s, "source": billing.source},
            "instances": [{"name": i.name, "gpu": i.gpu, "price_per_hour": i.price_per_hour,
                           "seconds": round(i.seconds, 1), "billed_seconds": i.billed_seconds,
                           "cost": round(i.cost, 4), **({"lost": True} if i.lost else {})} for i in instances],
            "source": "the ledger: the price quoted at rent time, from the create call to the destroy call"}


def _instance_cost(name: str, entry: dict[str, Any], billing: BillingRule) -> InstanceCost | None:
    price = entry.get("price_per_hour")
    steps = entry.get("steps", [])
    started = next((s["at"] for s in steps if s.get("state") == "requested"), None)
    if price is None or started is None:
        return None
    # A lost instance (taken back by the cloud) stopped costing when the run saw it go, not when it was terminated.
    ended = next((s["at"] for s in steps if s.get("state") in ("lost", "destroyed")), None)
    end = datetime.fromisoformat(ended) if ended else datetime.now(UTC)
    seconds = max(0.0, (end - datetime.fromisoformat(started)).total_seconds())
    lost = any(s.get("state") == "lost" for s in steps)
    return InstanceCost(name, entry.get("gpu"), float(price), seconds, billing.billed_seconds(seconds), lost)
