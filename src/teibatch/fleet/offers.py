"""What a GPU cloud offers, and which of its offers a run may rent.

An :class:`Offer` is one thing a cloud's create call can be asked for (a Lambda instance type in a
region, a RunPod GPU type, one Vast machine), with the price its API gives now. :func:`choose_offers`
keeps the ones the job allows — the GPU it names, or enough memory under a price cap — and that TEI
can run: a known compute capability of 7.5 or more with an image in ``configs/images.yaml`` for the
machine's platform (a Grace superchip such as Lambda's GH200 is aarch64, where TEI has no CUDA image
but GB10's: refused before renting, with the reason ``teibatch plan`` shows), and
memory enough for the model (the same checks as a host of provider ``ssh``). It orders them by price
per unit of throughput: the price over the card's FP16 TFLOPS in ``configs/clouds.yaml`` (an
estimate from datasheets, not a measurement); cards without that figure come after, cheapest first.
Pure functions: nothing here calls a cloud.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from teibatch.errors import GpuUnsupported
from teibatch.fleet.catalog import CloudCard, cloud_cards
from teibatch.fleet.images import GpuInfo, check_fits, choose_image

Capacity = Literal["on-demand", "spot", "any"]


@dataclass(frozen=True)
class Offer:
    """One rentable card: ``key`` is what the cloud's create call names (instance type, GPU type id)."""

    cloud: str
    key: str
    gpu: str                      # the cloud's own name of the GPU
    vram_gb: int
    price_per_hour: float         # USD per card-hour, as the cloud's API gives it now (a bid: what is bid)
    region: str | None = None
    interruptible: bool = False   # spot capacity: the cloud may take the instance back
    compute_capability: str | None = None   # the cloud's own figure, where its API gives one
    family: str | None = None     # marketplaces: what offers of one GPU model share (else the key does)

    @property
    def label(self) -> str:
        label = f"{self.key}@{self.region}" if self.region else self.key
        return f"{label} (interruptible)" if self.interruptible else label

    @property
    def card(self) -> CloudCard | None:
        """The GPU family of ``configs/clouds.yaml`` this offer's GPU belongs to: the first card whose pattern
        is found in ``gpu`` (case-insensitive)."""
        return next((c for c in cloud_cards() if re.search(c.pattern, self.gpu, re.IGNORECASE)), None)

    @property
    def platform(self) -> str:
        """The machine's CPU architecture (``uname -m``) as its card family says: x86_64 unless known otherwise."""
        card = self.card
        return card.platform if card is not None else "x86_64"


@dataclass(frozen=True)
class GpuWant:
    """The job's wish: GPU names (any of), or at least ``min_vram_gb``; at most ``max_price`` per card-hour."""

    names: tuple[str, ...] = ()
    min_vram_gb: int | None = None
    max_price: float | None = None
    regions: tuple[str, ...] = ()


@dataclass(frozen=True)
class OfferChoice:
    """The offers a run may rent, best first (cheapest per unit of throughput, then the job's region order),
    and why others may not."""

    usable: tuple[Offer, ...]
    refused: tuple[tuple[Offer, str], ...]

    def why_none(self) -> str:
        """A one-line account of the refusals, for :class:`~teibatch.errors.CapacityUnavailable`."""
        if not self.refused:
            return "the cloud lists no card at all"
        reasons: dict[str, list[str]] = {}
        for offer, reason in self.refused:
            reasons.setdefault(reason, []).append(offer.label)
        return "; ".join(f"{reason}: {', '.join(sorted(set(labels))[:6])}" for reason, labels in reasons.items())


def gpu_info(offer: Offer) -> GpuInfo | None:
    """The offer's card as the image table and the fit check see it (``None``: an unknown family)."""
    card = offer.card
    capability = offer.compute_capability or (card.compute_capability if card is not None else None)
    if capability is None:
        return None
    return GpuInfo(name=offer.gpu, compute_capability=capability, memory_mib=offer.vram_gb * 1024)


def names_match(wanted: str, gpu: str) -> bool:
    """Whether the job's GPU name ``wanted`` names ``gpu`` ("A10" names "A10 (24 GB PCIe)", not "A100")."""
    return re.search(rf"(?<![A-Za-z0-9]){re.escape(wanted.strip())}(?![A-Za-z0-9])", gpu, re.IGNORECASE) is not None


def refusal(offer: Offer, want: GpuWant, model_id: str | None, image: str | None = None) -> str | None:
    """Why the run may not rent ``offer`` (``None``: it may)."""
    if want.names and not any(names_match(name, offer.gpu) for name in want.names):
        return f"not {' or '.join(want.names)}"
    if want.min_vram_gb is not None and offer.vram_gb < want.min_vram_gb:
        return f"less than {want.min_vram_gb} GB of memory"
    if want.max_price is not None and offer.price_per_hour > want.max_price:
        return f"over the price cap of ${want.max_price:.2f}/h"
    if want.regions and offer.region is not None and offer.region not in want.regions:
        return "not in servers.regions"
    gpu = gpu_info(offer)
    if gpu is None:
        return "unknown GPU family (not in configs/clouds.yaml): compute capability unknown"
    try:
        choose_image(gpu, offer.platform, override=image)
        check_fits(model_id, gpu)
    except GpuUnsupported as exc:
        return str(exc).removeprefix(f"{offer.gpu}: ")
    return None


def choose_offers(offers: list[Offer], want: GpuWant, model_id: str | None, *, image: str | None = None) -> OfferChoice:
    """Split ``offers`` into those the run may rent, best first, and the refused ones with their reason."""
    usable, refused = [], []
    for offer in offers:
        reason = refusal(offer, want, model_id, image)
        if reason is None:
            usable.append(offer)
        else:
            refused.append((offer, reason))

    def rank(offer: Offer) -> tuple[bool, float, float, int, str]:
        region = want.regions.index(offer.region) if offer.region in want.regions else len(want.regions)
        tflops = offer.card.fp16_tflops if offer.card is not None else None
        per_unit = offer.price_per_hour / tflops if tflops else 0.0
        return (not tflops, per_unit, offer.price_per_hour, region, offer.label)

    return OfferChoice(tuple(sorted(usable, key=rank)), tuple(refused))


def capacity_of(offer: Offer) -> str:
    """``spot`` for an interruptible offer, else ``on-demand``: the words of ``servers.capacity``."""
    return "spot" if offer.interruptible else "on-demand"


def by_capacity(offers: Iterable[Offer], capacity: str) -> tuple[Offer, ...]:
    """The offers ``servers.capacity`` allows, in the order a run tries them: for ``any``, every spot
    offer before every on-demand one (each kind keeps its order)."""
    allowed = [o for o in offers if capacity == "any" or capacity_of(o) == capacity]
    return tuple(sorted(allowed, key=lambda o: not o.interruptible)) if capacity == "any" else tuple(allowed)
