"""What a run will cost before anything is rented: documents, tokens, cards, GPU-hours, dollars.

:func:`estimate_run` plans the shards (as ``run`` would), estimates the tokens on a sample (with the
model's own tokenizer when it is in the local Hugging Face cache, else the built-in estimate; with
chunking, the chunks and their tokens as the run will cut them: ``pipeline/plan_chunks.py``), and for
a GPU cloud job asks the cloud's API for the cards the job may rent and their prices now. Each card's
throughput is a bench measurement when one is given, else the figure from ``configs/clouds.yaml``
(named as the source). Time per card = tokens ÷ (throughput × count) + the startup budget
(``servers.startup_timeout``, counted in full); each card's time is rounded up by the cloud's billing
rule. :func:`check_cost_limit` refuses a job whose estimate is over ``limits.max_cost``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from teibatch.corpus import plan_shards, read_shard
from teibatch.corpus.records import Document
from teibatch.errors import JobSpecError
from teibatch.fleet.catalog import BillingRule, billing_rules, model_sizes, throughput_rule
from teibatch.fleet.hosted import DEFAULT_STARTUP_TIMEOUT_S
from teibatch.fleet.offers import Offer, choose_offers
from teibatch.job import CLOUD_PROVIDERS, JobSpec
from teibatch.pipeline.plan_chunks import estimate_chunks

DEFAULT_SAMPLE_DOCS = 500
CHARS_PER_TOKEN = 4           # the built-in estimate: about 4 characters a token in English text...
SPECIAL_TOKENS = 2            # ...plus [CLS] and [SEP]
BUILTIN_TOKENS = f"built-in estimate ({CHARS_PER_TOKEN} characters a token + {SPECIAL_TOKENS} special tokens)"

Tokenize = Callable[[str], int]


@dataclass(frozen=True)
class CardEstimate:
    """One card the job may rent: its price now, its throughput, and what ``count`` of them cost."""

    offer: Offer
    tokens_per_s: float | None
    throughput_source: str
    seconds: float | None          # one card's time: embedding share plus startup
    billed_seconds: int | None     # one card's time as the cloud bills it
    gpu_hours: float | None        # all cards together
    cost: float | None             # USD, all cards together

    def to_json(self) -> dict[str, Any]:
        o = self.offer
        return {"gpu": o.gpu, "key": o.key, "region": o.region, "vram_gb": o.vram_gb,
                "price_per_hour": o.price_per_hour, "tokens_per_s": self.tokens_per_s,
                "throughput_source": self.throughput_source, "seconds": self.seconds,
                "billed_seconds": self.billed_seconds, "gpu_hours": self.gpu_hours, "cost": self.cost}


@dataclass(frozen=True)
class RunEstimate:
    """The plan of a run; ``cards`` cheapest first (``cost`` is the cheapest card's, ``None`` if unknown)."""

    provider: str
    count: int
    shards: int
    documents: int
    tokens: int
    token_source: str
    startup_s: float
    billing: BillingRule | None = None
    cards: tuple[CardEstimate, ...] = ()
    refused: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    chunks: int | None = None  # with chunking: the chunks the run will embed (``tokens`` are theirs)

    @property
    def rents(self) -> bool:
        return self.provider in CLOUD_PROVIDERS

    @property
    def chosen(self) -> CardEstimate | None:
        """The card a run rents first: the cheapest (the same order the provider tries offers in)."""
        return self.cards[0] if self.cards else None

    @property
    def cost(self) -> float | None:
        if not self.rents:
            return 0.0
        return self.chosen.cost if self.chosen else None

    def to_json(self) -> dict[str, Any]:
        return {"provider": self.provider, "count": self.count, "shards": self.shards, "documents": self.documents,
                "chunks": self.chunks, "tokens": self.tokens, "token_source": self.token_source,
                "startup_s": self.startup_s,
                "billing": ({"increment_s": self.billing.increment_s, "minimum_s": self.billing.minimum_s,
                             "source": self.billing.source} if self.billing else None),
                "cards": [c.to_json() for c in self.cards],
                "refused": [{"offer": o, "reason": r} for o, r in self.refused], "cost": self.cost}


def builtin_tokens(text: str) -> int:
    """The built-in token estimate of one text."""
    return math.ceil(len(text) / CHARS_PER_TOKEN) + SPECIAL_TOKENS


def model_tokenizer(model_id: str | None) -> Tokenize | None:
    """The model's own tokenizer when its ``tokenizer.json`` is in the local Hugging Face cache (no download)."""
    if not model_id:
        return None
    try:
        from huggingface_hub import try_to_load_from_cache
        from tokenizers import Tokenizer
    except ImportError:
        return None
    path = try_to_load_from_cache(model_id, "tokenizer.json")
    if not isinstance(path, str):
        return None
    tokenizer = Tokenizer.from_file(path)
    return lambda text: len(tokenizer.encode(text).ids)


def estimate_tokens(documents: Iterable[Document], total: int, *, tokenize: Tokenize | None = None,
                    max_tokens: int | None = None, sample: int = DEFAULT_SAMPLE_DOCS) -> int:
    """Tokens in ``total`` documents, from the first ``sample`` (each cut at ``max_tokens``), scaled up."""
    count = tokens = 0
    for document in itertools.islice(documents, sample):
        n = (tokenize or builtin_tokens)(document.text)
        tokens += min(n, max_tokens) if max_tokens else n
        count += 1
    return 0 if count == 0 else math.ceil(tokens * total / count)


def card_estimate(offer: Offer, *, tokens: int, count: int, startup_s: float, billing: BillingRule,
                  parameters: int | None, bench_tokens_per_s: float | None) -> CardEstimate:
    """Time, billed time, GPU-hours and cost of ``count`` cards of ``offer`` for ``tokens`` tokens."""
    if bench_tokens_per_s:
        tokens_per_s: float | None = bench_tokens_per_s
        source = "bench measurement (--bench)"
    else:
        card, rule = offer.card, throughput_rule()
        if card is not None and card.fp16_tflops and parameters:
            tokens_per_s, source = rule.tokens_per_s(card.fp16_tflops, parameters), rule.source
        else:
            tokens_per_s = None
            source = ("no figure: the model's size is not in configs/models.yaml" if not parameters else
                      f"no figure for {offer.gpu} in configs/clouds.yaml") + "; pass --bench"
    if tokens_per_s is None:
        return CardEstimate(offer, None, source, None, None, None, None)
    seconds = tokens / (tokens_per_s * count) + startup_s
    billed = billing.billed_seconds(seconds)
    gpu_hours = count * billed / 3600
    return CardEstimate(offer, tokens_per_s, source, seconds, billed, gpu_hours, gpu_hours * offer.price_per_hour)


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


def estimate_run(job: JobSpec, *, offers: list[Offer] | None = None, bench_tokens_per_s: float | None = None,
                 sample: int = DEFAULT_SAMPLE_DOCS) -> RunEstimate:
    """Plan ``job``: shards, documents, tokens; for a GPU cloud, the cards it may rent and their cost.

    ``offers`` are the cloud's offers (default: asked from the cloud's API, with the environment's key).
    """
    options = job.corpus_options()
    shards = plan_shards(options)
    documents = sum(s.size for s in shards)
    tokenize = model_tokenizer(job.model.id)
    model = model_sizes().get(job.model.id or "")

    def sample_docs() -> Iterable[Document]:
        for shard in shards:
            for item in read_shard(options, shard, verify=False):
                if isinstance(item, Document):
                    yield item

    chunks = None
    if job.chunking.enabled:  # the chunks' tokens, as the run will cut and send them
        estimate = estimate_chunks(job, sample_docs(), documents, sample)
        chunks, tokens, source = estimate.chunks, estimate.tokens, estimate.source
    else:
        tokens = estimate_tokens(sample_docs(), documents, tokenize=tokenize, sample=sample,
                                 max_tokens=model.max_tokens if model and job.model.truncate else None)
        source = f"{job.model.id} tokenizer" if tokenize else BUILTIN_TOKENS
    provider, count = job.servers.provider, job.servers.count
    if provider not in CLOUD_PROVIDERS:
        return RunEstimate(provider, count, len(shards), documents, tokens, source, 0.0, chunks=chunks)
    from teibatch.pipeline.providers import cloud_api, gpu_want

    if offers is None:
        api = cloud_api(job)
        try:
            offers = api.offers()
        finally:
            api.close()
    choice = choose_offers(cheapest_per_card(offers), gpu_want(job), job.model.id, image=job.servers.image)
    billing, startup = billing_rules()[provider], startup_budget(job)
    cards = [card_estimate(o, tokens=tokens, count=count, startup_s=startup, billing=billing,
                           parameters=model.parameters if model else None, bench_tokens_per_s=bench_tokens_per_s)
             for o in choice.usable]
    cards.sort(key=lambda c: (c.cost is None, c.cost or 0.0, c.offer.price_per_hour))
    return RunEstimate(provider, count, len(shards), documents, tokens, source, startup, billing, tuple(cards),
                       tuple((o.label, reason) for o, reason in choice.refused), chunks=chunks)


def check_cost_limit(job: JobSpec, estimate: RunEstimate) -> None:
    """Raise :class:`JobSpecError` (key ``limits.max_cost``) when the estimate is over it, or unknown."""
    limit = job.limits.max_cost
    if limit is None or not estimate.rents:
        return
    cost = estimate.cost
    if cost is None:
        raise JobSpecError(f"the run's cost cannot be estimated (no card to rent, or no throughput figure for it) "
                           f"and limits.max_cost is ${limit:.2f}: pass a bench figure to `teibatch plan --bench`, "
                           "or remove the limit", key="limits.max_cost")
    if cost > limit:
        chosen = estimate.chosen
        assert chosen is not None
        raise JobSpecError(f"the run would cost about ${cost:.2f} ({estimate.count} × {chosen.offer.gpu}, "
                           f"{chosen.gpu_hours:.2f} GPU-hours at ${chosen.offer.price_per_hour:.2f}/h), over "
                           f"limits.max_cost (${limit:.2f}); see `teibatch plan`", key="limits.max_cost")
