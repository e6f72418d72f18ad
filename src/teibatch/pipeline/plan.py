"""What a run will cost before anything is rented: documents, tokens, cards, GPU-hours, dollars.

:func:`estimate_run` plans the shards (as ``run`` would), estimates the tokens on a sample spread over the
corpus (``corpus/sampling.py``), with the model's own tokenizer when it is in the local Hugging Face
cache, else the built-in estimate (with chunking, the chunks and their tokens as the run will cut them,
and the range they most likely lie in: ``pipeline/plan_chunks.py``), and for
a GPU cloud job asks the cloud's API for the cards the job may rent, at each capacity, and their
prices now (per card and capacity: :mod:`~teibatch.pipeline.pricing`). :func:`check_cost_limit` refuses
a job whose estimate is over ``limits.max_cost``.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from teibatch.corpus import LeftOut, list_corpus, plan_shards, read_shard
from teibatch.corpus.records import Document
from teibatch.corpus.sampling import spread_sample
from teibatch.fleet.catalog import BillingRule, model_sizes
from teibatch.fleet.offers import Offer
from teibatch.job import CLOUD_PROVIDERS, JobSpec
from teibatch.pipeline.plan_chunks import estimate_chunks
from teibatch.pipeline.pricing import (
    BenchFigures,
    CardEstimate,
    CloudPricing,
    check_max_cost,
    price_cards,
)

DEFAULT_SAMPLE_DOCS = 500
CHARS_PER_TOKEN = 4           # the built-in estimate: about 4 characters a token in English text...
SPECIAL_TOKENS = 2            # ...plus [CLS] and [SEP]
BUILTIN_TOKENS = f"built-in estimate ({CHARS_PER_TOKEN} characters a token + {SPECIAL_TOKENS} special tokens)"

Tokenize = Callable[[str], int]


@dataclass(frozen=True)
class RunEstimate:
    """The plan of a run; for a GPU cloud, ``pricing``: the cards per capacity, the run's estimate and the
    cheapest combination (``cost`` is the run's estimate, ``None`` if unknown)."""

    provider: str
    count: int
    shards: int
    documents: int
    tokens: int
    token_source: str
    startup_s: float
    pricing: CloudPricing | None = None
    chunks: int | None = None  # with chunking: the chunks the run will embed (``tokens`` are theirs)
    chunks_range: tuple[int, int] | None = None  # with chunking: where ``chunks`` most likely lies
    tokens_range: tuple[int, int] | None = None  # with chunking: the same for ``tokens``
    left_out: LeftOut = field(default_factory=LeftOut)  # files the corpus path matched that the run will not read

    @property
    def rents(self) -> bool:
        return self.provider in CLOUD_PROVIDERS

    @property
    def billing(self) -> BillingRule | None:
        return self.pricing.billing if self.pricing else None

    @property
    def cards(self) -> tuple[CardEstimate, ...]:
        """One row per card and capacity, cheapest first."""
        return self.pricing.cards if self.pricing else ()

    @property
    def refused(self) -> tuple[tuple[str, str], ...]:
        return self.pricing.refused if self.pricing else ()

    @property
    def chosen(self) -> CardEstimate | None:
        """What the run rents: ``servers.count`` cards of the offer its provider tries first."""
        return self.pricing.run if self.pricing else None

    @property
    def cost(self) -> float | None:
        if not self.rents:
            return 0.0
        return self.chosen.cost if self.chosen else None

    def to_json(self) -> dict[str, Any]:
        pricing = self.pricing.to_json() if self.pricing else {
            "capacity": None, "max_runtime_s": None, "billing": None, "cards": [], "refused": [], "run": None,
            "cheapest": None}
        return {"provider": self.provider, "count": self.count, "shards": self.shards, "documents": self.documents,
                "chunks": self.chunks, "chunks_range": list(self.chunks_range) if self.chunks_range else None,
                "tokens": self.tokens, "tokens_range": list(self.tokens_range) if self.tokens_range else None,
                "token_source": self.token_source,
                "startup_s": self.startup_s, "left_out": self.left_out.to_json(),
                **pricing, "cost": self.cost}


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
    """Tokens in ``total`` documents, from ``sample`` of ``documents`` (each cut at ``max_tokens``), scaled up."""
    count = tokens = 0
    for document in itertools.islice(documents, sample):
        n = (tokenize or builtin_tokens)(document.text)
        tokens += min(n, max_tokens) if max_tokens else n
        count += 1
    return 0 if count == 0 else math.ceil(tokens * total / count)


def estimate_run(job: JobSpec, *, offers: list[Offer] | None = None, bench_tokens_per_s: float | None = None,
                 bench: BenchFigures | None = None, sample: int = DEFAULT_SAMPLE_DOCS) -> RunEstimate:
    """Plan ``job``: shards, documents, tokens; for a GPU cloud, the cards it may rent and their cost.

    ``offers`` are the cloud's offers (default: asked from the cloud's API, with the environment's key);
    ``bench`` the measured throughputs (``bench_tokens_per_s``: one figure for every card).
    """
    options = job.corpus_options()
    listing = list_corpus(options)
    shards = plan_shards(options, listing)
    documents = sum(s.size for s in shards)
    tokenize = model_tokenizer(job.model.id)
    model = model_sizes().get(job.model.id or "")

    runs = spread_sample(shards, sample)  # across the files and across each: not the first documents
    chunks = chunks_range = tokens_range = None
    if job.chunking.enabled:  # the chunks' tokens, as the run will cut and send them
        estimate = estimate_chunks(job, (read_shard(options, run, verify=False) for run in runs), documents)
        chunks, tokens, source = estimate.chunks.value, estimate.tokens.value, estimate.source
        chunks_range = (estimate.chunks.low, estimate.chunks.high)
        tokens_range = (estimate.tokens.low, estimate.tokens.high)
    else:
        sampled = (item for run in runs for item in read_shard(options, run, verify=False)
                   if isinstance(item, Document))
        tokens = estimate_tokens(sampled, documents, tokenize=tokenize, sample=sample,
                                 max_tokens=model.max_tokens if model and job.model.truncate else None)
        source = f"{job.model.id} tokenizer" if tokenize else BUILTIN_TOKENS
    provider, count = job.servers.provider, job.servers.count
    if provider not in CLOUD_PROVIDERS:
        return RunEstimate(provider, count, len(shards), documents, tokens, source, 0.0, chunks=chunks,
                           chunks_range=chunks_range, tokens_range=tokens_range,
                           left_out=listing.left_out)
    if bench is None and bench_tokens_per_s:
        bench = BenchFigures((("", bench_tokens_per_s, "--bench"),))
    pricing = price_cards(job, tokens=tokens, parameters=model.parameters if model else None, offers=offers,
                          bench=bench)
    return RunEstimate(provider, count, len(shards), documents, tokens, source, pricing.startup_s, pricing,
                       chunks=chunks, chunks_range=chunks_range, tokens_range=tokens_range,
                       left_out=listing.left_out)


def check_cost_limit(job: JobSpec, estimate: RunEstimate) -> None:
    """Raise :class:`JobSpecError` (key ``limits.max_cost``) when the run's estimate is over it, or unknown."""
    if estimate.rents:
        check_max_cost(job, estimate.chosen)
