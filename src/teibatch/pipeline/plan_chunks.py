"""``teibatch plan`` for a chunked job: chunks and tokens of a sample, cut as the run will cut them.

The sample is spread over the corpus (``corpus/sampling.py``), and the estimate comes with the range
the runs' spread allows.

The sample is chunked with the same token rule the run would choose (``pipeline/tokenizer_choice.py``)
and ``max_tokens`` as the servers would make it: the job's number, else the model's limit from
``configs/models.yaml``, the built-in server's ``--max-input-length`` (its default when not given),
or ``client.max_input_length``, whichever is lowest. Where the run's token rule needs the servers
(no tokenizer at hand here), the sample is cut by characters at :data:`CHARS_PER_TOKEN` a token and
the counts are labelled as that estimate.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from teibatch.corpus import ChunkingOptions, Shard, read_shard
from teibatch.corpus.records import Document, Reject
from teibatch.corpus.sampling import Estimate, estimate_total, spread_sample
from teibatch.errors import CorpusError, TokenizerUnavailable
from teibatch.fleet.catalog import model_sizes
from teibatch.job import JobSpec
from teibatch.pipeline.chunking_setup import make_plan
from teibatch.pipeline.chunks import ChunkPlan, Units
from teibatch.pipeline.tokenizer_choice import CHARS, choose_counter, server_flag

CHARS_PER_TOKEN = 4
SPECIAL_TOKENS = 2
DEFAULT_LIMIT = 512  # the built-in server's and TEI's usual max_input_length, for a model known nowhere here
MAX_INPUT_LENGTH_FLAG = "--max-input-length"
RUN_SAMPLE_DOCS = 200  # documents a chunked run cuts before it starts, to size its shard tasks


@dataclass(frozen=True)
class ChunkEstimate:
    """Chunks and the tokens sent for them, over the whole corpus (scaled up from a sample spread over
    it, with the range each most likely lies in), and how they were counted."""

    chunks: Estimate
    tokens: Estimate
    source: str
    documents: int  # the corpus's rows, which the estimates are scaled to

    @property
    def chunks_per_document(self) -> float:
        """Chunks a document makes on average, at the top of the range: what a run sizes its tasks by."""
        return self.chunks.high / self.documents if self.documents else 1.0


def estimate_chunks(job: JobSpec, sample: Iterable[Iterable[Document | Reject]], total: int) -> ChunkEstimate:
    """Cut the documents of each run of ``sample`` (see ``corpus/sampling.py``) as the run would; scale
    to ``total`` rows, the corpus's."""
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
    chunks: list[tuple[int, float]] = []
    tokens: list[tuple[int, float]] = []
    for run in sample:
        items = list(run)
        first = len(units)
        for _ in units.expand((item for item in items if isinstance(item, Document)), [], []):
            pass
        if estimated:
            made = sum(math.ceil((end - start) / CHARS_PER_TOKEN) + SPECIAL_TOKENS
                       for start, end in zip(units.start[first:], units.end[first:], strict=True))
        else:
            made = sum(units.tokens[first:])
        chunks.append((len(items), len(units) - first))
        tokens.append((len(items), made))
    if estimated:
        source = (f"estimate: chunks cut by characters, {CHARS_PER_TOKEN} a token, since no tokenizer for "
                  f"{job.model.id or 'the servers’ model'} is at hand here (the run counts with the servers' own)")
    else:
        source = f"chunked with {plan.source.label}, max_tokens {plan.options.max_tokens}"
    return ChunkEstimate(estimate_total(chunks, total), estimate_total(tokens, total), source, total)


def chunks_per_document(job: JobSpec, shards: Sequence[Shard]) -> float:
    """Chunks a document of ``shards`` makes on average, at the top of the range estimated on
    :data:`RUN_SAMPLE_DOCS` documents spread over them: what a chunked run sizes its shard tasks by,
    since they send chunks, not documents. 1 without chunking, or when the sample cannot be read
    (the shard that holds it will say why)."""
    if not job.chunking.enabled:
        return 1.0
    options = job.corpus_options()
    runs = spread_sample(shards, RUN_SAMPLE_DOCS)
    try:
        estimate = estimate_chunks(job, (read_shard(options, run, verify=False) for run in runs),
                                   sum(shard.size for shard in shards))
    except CorpusError:
        return 1.0
    return max(1.0, estimate.chunks_per_document)


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
