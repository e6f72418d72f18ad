"""What renting costs, per card and capacity, and which combination to rent: the GPU-cloud half of ``teibatch plan``.

For every card the job may rent and every capacity the cloud sells it at (on-demand, and spot on
``runpod`` and ``vast``) there is one row at ``servers.count`` cards: the price per card-hour now, the
throughput of one card (a ``teibatch bench`` measurement when one is given for that card, else the
catalog estimate from ``configs/clouds.yaml``, labelled so), the time per card = tokens ÷ (throughput ×
count) + the startup budget (``servers.startup_timeout``, counted in full), that time rounded up by the
cloud's billing rule, the GPU-hours and the cost. Two choices come out of the rows:

* **the run's estimate**: what ``teibatch run`` rents — ``servers.count`` cards of the offer its provider
  tries first (ranked as :func:`~teibatch.fleet.offers.choose_offers` ranks them, among the capacities
  ``servers.capacity`` allows; ``any`` tries spot first). :func:`check_cost_limit` holds it against
  ``limits.max_cost``.
* **the cheapest combination**: the card × capacity × count (1 to ``servers.count``) of least cost whose
  time per card is within ``limits.max_runtime`` (any time when it is unset); none when none is.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from teibatch.errors import JobSpecError
from teibatch.fleet.catalog import BillingRule, billing_rules, throughput_rule
from teibatch.fleet.hosted import DEFAULT_STARTUP_TIMEOUT_S
from teibatch.fleet.offers import Offer, by_capacity, capacity_of, choose_offers, names_match
from teibatch.job import JobSpec

CATALOG = "catalog estimate"
BENCH = "bench measurement"


@dataclass(frozen=True)
class BenchFigures:
    """Measured tokens/s of one card: ``(gpu, tokens_per_s, source)`` each, for the cards the GPU name names,
    or for every other card when ``gpu`` is empty."""

    figures: tuple[tuple[str, float, str], ...] = ()

    def for_offer(self, offer: Offer) -> tuple[float | None, str]:
        """The figure measured for ``offer``'s card (the first GPU name that names it, else the one for every
        card) and its source; ``(None, "")`` when there is none."""
        named = [(tps, source) for gpu, tps, source in self.figures if gpu and names_match(gpu, offer.gpu)]
        every = [(tps, source) for gpu, tps, source in self.figures if not gpu]
        return next(iter(named + every), (None, ""))


@dataclass(frozen=True)
class CardEstimate:
    """``count`` cards of one offer (a card at one capacity): its price now, its throughput, time and cost."""

    offer: Offer
    tokens_per_s: float | None
    throughput_source: str
    seconds: float | None          # one card's time: embedding share plus startup
    billed_seconds: int | None     # one card's time as the cloud bills it
    gpu_hours: float | None        # all cards together
    cost: float | None             # USD, all cards together
    count: int = 1
    allowed: bool = True           # servers.capacity allows this capacity

    @property
    def capacity(self) -> str:
        return capacity_of(self.offer)

    def to_json(self) -> dict[str, Any]:
        o = self.offer
        return {"gpu": o.gpu, "key": o.key, "region": o.region, "vram_gb": o.vram_gb, "capacity": self.capacity,
                "allowed": self.allowed, "count": self.count, "price_per_hour": o.price_per_hour,
                "tokens_per_s": self.tokens_per_s, "throughput_source": self.throughput_source,
                "seconds": self.seconds, "billed_seconds": self.billed_seconds, "gpu_hours": self.gpu_hours,
                "cost": self.cost}


@dataclass(frozen=True)
class CloudPricing:
    """The rows of a GPU-cloud plan (cheapest first) and the two choices made from them."""

    capacity: str                  # the job's servers.capacity
    startup_s: float
    billing: BillingRule
    cards: tuple[CardEstimate, ...]
    refused: tuple[tuple[str, str], ...]
    run: CardEstimate | None       # what `teibatch run` rents: servers.count cards of the offer it tries first
    cheapest: CardEstimate | None  # the cheapest card × capacity × count within max_runtime
    max_runtime_s: float | None

    def to_json(self) -> dict[str, Any]:
        b = self.billing
        return {"capacity": self.capacity, "max_runtime_s": self.max_runtime_s,
                "billing": {"increment_s": b.increment_s, "minimum_s": b.minimum_s, "source": b.source},
                "cards": [c.to_json() for c in self.cards],
                "refused": [{"offer": o, "reason": r} for o, r in self.refused],
                "run": self.run.to_json() if self.run else None,
                "cheapest": self.cheapest.to_json() if self.cheapest else None}


def priced(estimate: CardEstimate, count: int, *, tokens: int, startup_s: float,
           billing: BillingRule) -> CardEstimate:
    """``estimate``'s card and throughput at ``count`` cards: time, billed time, GPU-hours and cost."""
    if estimate.tokens_per_s is None:
        return replace(estimate, count=count)
    seconds = tokens / (estimate.tokens_per_s * count) + startup_s
    billed = billing.billed_seconds(seconds)
    gpu_hours = count * billed / 3600
    return replace(estimate, seconds=seconds, billed_seconds=billed, gpu_hours=gpu_hours,
                   cost=gpu_hours * estimate.offer.price_per_hour, count=count)


def card_estimate(offer: Offer, *, tokens: int, count: int, startup_s: float, billing: BillingRule,
                  parameters: int | None, bench_tokens_per_s: float | None,
                  bench_source: str = "--bench") -> CardEstimate:
    """Time, billed time, GPU-hours and cost of ``count`` cards of ``offer`` for ``tokens`` tokens."""
    if bench_tokens_per_s:
        tokens_per_s: float | None = bench_tokens_per_s
        source = f"{BENCH} ({bench_source})"
    else:
        card, rule = offer.card, throughput_rule()
        if card is not None and card.fp16_tflops and parameters:
            tokens_per_s, source = rule.tokens_per_s(card.fp16_tflops, parameters), f"{CATALOG}: {rule.source}"
        else:
            tokens_per_s = None
            source = ("no figure: the model's size is not in configs/models.yaml" if not parameters else
                      f"no figure for {offer.gpu} in configs/clouds.yaml") + "; pass --bench"
    unpriced = CardEstimate(offer, tokens_per_s, source, None, None, None, None, count)
    return priced(unpriced, count, tokens=tokens, startup_s=startup_s, billing=billing)


def startup_budget(job: JobSpec) -> float:
    """The startup time counted per card: ``servers.startup_timeout`` as set, else launched containers' default."""
    if "startup_timeout" in job.servers.model_fields_set:
        return job.servers.startup_timeout
    return DEFAULT_STARTUP_TIMEOUT_S


def cheapest_per_card(offers: Iterable[Offer]) -> list[Offer]:
    """One offer per card (instance type / GPU type / a marketplace's GPU model) and capacity: its cheapest
    region or machine."""
    best: dict[tuple[str, bool], Offer] = {}
    for offer in offers:
        card = (offer.family or offer.key, offer.interruptible)
        if card not in best or offer.price_per_hour < best[card].price_per_hour:
            best[card] = offer
    return list(best.values())


def cheapest_combination(cards: Iterable[CardEstimate], count: int, *, tokens: int, startup_s: float,
                         billing: BillingRule, max_runtime_s: float | None) -> CardEstimate | None:
    """The card × capacity × count (1 to ``count``) of least cost whose time per card is within
    ``max_runtime_s`` (``None``: any time); the faster of equal costs. ``None`` when none is."""
    fits = [c for card in cards if card.tokens_per_s
            for n in range(1, count + 1)
            if (c := priced(card, n, tokens=tokens, startup_s=startup_s, billing=billing)).seconds is not None
            and (max_runtime_s is None or c.seconds <= max_runtime_s)]
    return min(fits, key=lambda c: (c.cost or 0.0, c.seconds or 0.0, c.count), default=None)


def price_cards(job: JobSpec, *, tokens: int, parameters: int | None, offers: list[Offer] | None = None,
                bench: BenchFigures | None = None) -> CloudPricing:
    """The rows and choices of a GPU-cloud job. ``offers`` default: asked from the cloud's API (both
    capacities, whatever the job's), with the environment's key."""
    from teibatch.pipeline.fleet_from_job import cloud_api, gpu_want

    if offers is None:
        api = cloud_api(job.servers, capacity="any")
        try:
            offers = api.offers()
        finally:
            api.close()
    servers, bench = job.servers, bench or BenchFigures()
    choice = choose_offers(cheapest_per_card(offers), gpu_want(job.servers), job.model.id, image=servers.image)
    allowed = by_capacity(choice.usable, servers.capacity)
    billing, startup = billing_rules()[servers.provider], startup_budget(job)
    cards = [replace(card_estimate(o, tokens=tokens, count=servers.count, startup_s=startup, billing=billing,
                                   parameters=parameters, bench_tokens_per_s=figure, bench_source=source),
                     allowed=o in allowed)
             for o in choice.usable for figure, source in [bench.for_offer(o)]]
    run = next((c for c in cards if allowed and c.offer == allowed[0]), None)
    cards.sort(key=lambda c: (c.cost is None, c.cost or 0.0, c.offer.price_per_hour))
    max_runtime = job.limits.max_runtime
    cheapest = cheapest_combination(cards, servers.count, tokens=tokens, startup_s=startup, billing=billing,
                                    max_runtime_s=max_runtime)
    return CloudPricing(servers.capacity, startup, billing, tuple(cards),
                        tuple((o.label, reason) for o, reason in choice.refused), run, cheapest, max_runtime)


def duration(seconds: float) -> str:
    """``2m30s``, ``1h05m``: a time per card as the plan prints it."""
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def _combination(card: CardEstimate) -> str:
    o = card.offer
    key = f"{o.key}@{o.region}" if o.region else o.key
    return f"{card.count} × {o.gpu}{'' if key == o.gpu else f' ({key})'} {card.capacity}"


def pricing_lines(pricing: CloudPricing, provider: str, count: int) -> list[str]:
    """``teibatch plan``'s text for the rows and the two choices."""
    billing = pricing.billing
    lines = [f"provider {provider}, {count} card(s), capacity {pricing.capacity}; startup "
             f"{pricing.startup_s:.0f}s per card; billed per {billing.increment_s}s, at least {billing.minimum_s}s "
             f"({billing.source})",
             f"  {'card':<28} {'key':<20} {'capacity':<9} {'price/h':>7} {'tokens/s':>28} {'time':>7} {'GPU-h':>6} "
             f"{'cost':>8}"]
    for card in pricing.cards:
        o = card.offer
        key = f"{o.key}@{o.region}" if o.region else o.key
        key = "" if key == o.gpu else key
        head = f"  {o.gpu:<28} {key:<20} {card.capacity:<9} ${o.price_per_hour:>6.2f}"
        where = "" if card.allowed else f"  (not servers.capacity {pricing.capacity})"
        if card.tokens_per_s is None or card.seconds is None or card.gpu_hours is None or card.cost is None:
            lines.append(f"{head}  {card.throughput_source}{where}")
            continue
        label = BENCH if card.throughput_source.startswith(BENCH) else CATALOG
        lines.append(f"{head} {f'{card.tokens_per_s:,.0f} ({label})':>28} {duration(card.seconds):>7} "
                     f"{card.gpu_hours:>6.2f} ${card.cost:>7.2f}{where}")
    sources = sorted({c.throughput_source for c in pricing.cards if c.tokens_per_s is not None})
    lines += [f"throughput: {source}" for source in sources]
    lines += [f"  refused {label}: {reason}" for label, reason in pricing.refused]
    run = pricing.run
    if run is not None and run.cost is not None and run.gpu_hours is not None:
        lines.append(f"run: {_combination(run)} (the offer it tries first): {run.gpu_hours:.2f} GPU-h, "
                     f"${run.cost:.2f}")
    limit = f"limits.max_runtime ({duration(pricing.max_runtime_s)})" if pricing.max_runtime_s else "any time"
    best = pricing.cheapest
    if best is not None and best.seconds is not None and best.cost is not None:
        lines.append(f"cheapest within {limit}: {_combination(best)}: {duration(best.seconds)} per card, "
                     f"${best.cost:.2f}")
    elif pricing.max_runtime_s and any(c.tokens_per_s for c in pricing.cards):
        lines.append(f"cheapest within {limit}: none; no card, capacity and count up to {count} finishes in time")
    return lines


def check_max_cost(job: JobSpec, run: CardEstimate | None) -> None:
    """Raise :class:`JobSpecError` (key ``limits.max_cost``) when the run's estimate is over it, or unknown."""
    limit = job.limits.max_cost
    if limit is None:
        return
    if run is None or run.cost is None or run.gpu_hours is None:
        raise JobSpecError(f"the run's cost cannot be estimated (no card to rent, or no throughput figure for it) "
                           f"and limits.max_cost is ${limit:.2f}: pass a bench figure to `teibatch plan --bench`, "
                           "or remove the limit", key="limits.max_cost")
    if run.cost > limit:
        raise JobSpecError(f"the run would cost about ${run.cost:.2f} ({run.count} × {run.offer.gpu} {run.capacity}, "
                           f"{run.gpu_hours:.2f} GPU-hours at ${run.offer.price_per_hour:.2f}/h), over "
                           f"limits.max_cost (${limit:.2f}); see `teibatch plan`", key="limits.max_cost")
