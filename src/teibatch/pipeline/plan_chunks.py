"""``teibatch plan`` for a chunked job: chunks and tokens of a sample, cut as the run will cut them.

The sample is chunked with the same token rule the run would choose (``pipeline/tokenizer_choice.py``)
and ``max_tokens`` as the servers would make it: the job's number, else the model's limit from
``configs/models.yaml``, the built-in server's ``--max-input-length`` (its default when not given),
or ``client.max_input_length``, whichever is lowest. Where the run's token rule needs the servers
(no tokenizer at hand here), the sample is cut by characters at :data:`CHARS_PER_TOKEN` a token and
the counts are labelled as that estimate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable
from dataclasses import dataclass

from teibatch.corpus import ChunkingOptions
from teibatch.corpus.records import Document
from teibatch.errors import TokenizerUnavailable
from teibatch.fleet.catalog import model_sizes
from teibatch.job import JobSpec
from teibatch.pipeline.chunking_setup import make_plan
from teibatch.pipeline.chunks import ChunkPlan, Units
from teibatch.pipeline.tokenizer_choice import CHARS, choose_counter, server_flag

CHARS_PER_TOKEN = 4
SPECIAL_TOKENS = 2
DEFAULT_LIMIT = 512  # the built-in server's and TEI's usual max_input_length, for a model known nowhere here
MAX_INPUT_LENGTH_FLAG = "--max-input-length"


@dataclass(frozen=True)
class ChunkEstimate:
    """Chunks and the tokens sent for them, over the whole corpus (scaled up from a sample), and how counted."""

    chunks: int
    tokens: int
    source: str


def estimate_chunks(job: JobSpec, documents: Iterable[Document], total: int, sample: int) -> ChunkEstimate:
    """Cut the first ``sample`` of ``documents`` as the run would; scale to ``total`` documents."""
    limit = _server_limit(job)
    try:
        plan = make_plan(job, choose_counter(job, job.model.id), limit)
        estimated = False
    except TokenizerUnavailable:
        overlap = job.chunking.overlap_tokens * CHARS_PER_TOKEN
        size = (_max_tokens(job, limit) - SPECIAL_TOKENS) * CHARS_PER_TOKEN
        plan = ChunkPlan(ChunkingOptions(size, overlap, "chars"), CHARS, prefix=job.chunking.prefix,
                         titled=job.chunking.title_field is not None)
        estimated = True
    units = Units(plan, {})
    read: list[Document] = []
    for _ in units.expand(itertools.islice(documents, sample), read, []):
        pass
    tokens = sum(units.tokens)
    if estimated:
        tokens = sum(math.ceil((end - start) / CHARS_PER_TOKEN) + SPECIAL_TOKENS
                     for start, end in zip(units.start, units.end, strict=True))
        source = (f"estimate: chunks cut by characters, {CHARS_PER_TOKEN} a token, since no tokenizer for "
                  f"{job.model.id or 'the servers’ model'} is at hand here (the run counts with the servers' own)")
    else:
        source = f"chunked with {plan.source.label}, max_tokens {plan.options.max_tokens}"
    seen = len(read) or 1
    return ChunkEstimate(math.ceil(len(units) * total / seen), math.ceil(tokens * total / seen), source)


def _max_tokens(job: JobSpec, limit: int) -> int:
    """``chunking.max_tokens`` as a number for servers that take ``limit`` (``client`` limit included)."""
    wanted, client = job.chunking.max_tokens, job.client.max_input_length
    limit = min(limit, client) if isinstance(client, int) else limit
    return limit if wanted == "auto" else min(int(wanted), limit)


def _server_limit(job: JobSpec) -> int:
    """What the servers will most likely take (see the module docstring); a job's own ``max_tokens``
    above it is taken at its word, since the plan only guesses the servers' limit."""
    known = model_sizes().get(job.model.id or "")
    flag = server_flag(job.servers.server_args, MAX_INPUT_LENGTH_FLAG) if job.servers.provider == "local" else None
    limit = known.max_tokens if known else int(flag) if flag and flag.isdigit() else DEFAULT_LIMIT
    wanted = job.chunking.max_tokens
    return limit if wanted == "auto" else max(limit, int(wanted))
