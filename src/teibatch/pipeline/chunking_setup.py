"""A chunked run's settings, fixed in the driver: the token rule, and ``max_tokens`` against the servers.

The token rule is chosen before any server starts when the job says enough to choose it (a
tokenizer path, built-in servers, a model whose tokenizer.json is at hand, ``strategy: chars``), so
a tokenizer path that cannot be read stops the run before anything is rented; else once the
servers have said which model they serve, where ``auto`` ends with their own ``/tokenize`` route.
``max_tokens: auto`` becomes the servers' smallest ``max_input_length``, or ``client.max_input_length``
when that is lower; a number above the servers' limit is refused, since the servers would cut
every full chunk.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from teibatch.corpus import Chunker, ChunkingOptions
from teibatch.errors import JobSpecError, TokenizerUnavailable
from teibatch.job import JobSpec
from teibatch.pipeline.chunks import ChunkPlan, CounterSource, TokenizeRoute
from teibatch.pipeline.connect import Fleet
from teibatch.pipeline.tokenizer_choice import choose_counter
from teibatch.tei.info import ClientLimits


def early_counter(job: JobSpec) -> CounterSource | None:
    """The job's token rule, when it can be chosen before the servers are met; ``None`` otherwise
    (no chunking, or ``auto`` with no rule at hand: the servers' model and route decide). Raises
    :class:`TokenizerUnavailable` when ``chunking.tokenizer`` names a file that cannot be read."""
    if not job.chunking.enabled:
        return None
    try:
        return choose_counter(job, job.model.id)
    except TokenizerUnavailable:
        if job.chunking.tokenizer == "auto":
            return None
        raise


def resolve_max_tokens(job: JobSpec, server_limit: int) -> int:
    """``chunking.max_tokens`` as a number: ``auto`` is ``server_limit`` or ``client.max_input_length``
    when lower; :class:`JobSpecError` when the job's number is above ``server_limit``."""
    wanted = job.chunking.max_tokens
    client = job.client.max_input_length
    limit = min(server_limit, client) if isinstance(client, int) else server_limit
    if wanted == "auto":
        return limit
    if wanted > limit:
        raise JobSpecError(f"chunking.max_tokens ({wanted}) is above what the servers take ({limit} tokens: their "
                           "max_input_length, or client.max_input_length): every full chunk would be cut; set it "
                           f"to {limit} or less, or auto", key="chunking.max_tokens")
    return int(wanted)


def chunk_plan(job: JobSpec, fleet: Fleet, counter: CounterSource | None, limits: Sequence[ClientLimits]) -> ChunkPlan:
    """The shard tasks' :class:`ChunkPlan` for ``job`` against ``fleet``; ``counter`` from :func:`early_counter`,
    ``limits`` the run's towards each of ``fleet``'s servers (for their ``/tokenize`` route)."""
    route = TokenizeRoute.over([server.endpoint for server in fleet.servers], limits,
                               prompt_name=job.model.prompt_name, timeout=job.client.request_timeout,
                               max_retries=job.client.max_retries,
                               max_input_length=min(server.info.max_input_length for server in fleet.servers))
    source = counter or choose_counter(job, fleet.model_id, route)
    try:
        return make_plan(job, source, min(server.info.max_input_length for server in fleet.servers))
    except BaseException:
        source.release()  # a /tokenize counter the check opened in this process
        raise


def make_plan(job: JobSpec, source: CounterSource, server_limit: int) -> ChunkPlan:
    """The :class:`ChunkPlan` of ``job`` counting with ``source`` for servers taking ``server_limit``
    tokens; :class:`JobSpecError` when the options cannot work with the model's special tokens."""
    chunking = job.chunking
    assert chunking.strategy is not None
    max_tokens = resolve_max_tokens(job, server_limit)
    try:
        options = ChunkingOptions(max_tokens, chunking.overlap_tokens, chunking.strategy)
        plan = ChunkPlan(options, source, prefix=chunking.prefix, titled=chunking.title_field is not None,
                         store_text=chunking.store_text, document_vector=chunking.document_vector == "mean")
        Chunker(options, source.counter())  # checks the overlap against the special tokens
    except ValueError as exc:
        raise JobSpecError(f"chunking: {exc} (max_tokens {max_tokens} for these servers)", key="chunking") from exc
    return plan


def chunking_info(plan: ChunkPlan, job: JobSpec | None = None, *, hashed: bool = False) -> dict[str, Any]:
    """What an output records of its chunking: in the manifest's ``info`` (no ``job``) the numbers the
    job's ``auto`` became and the token rule; in a part's metadata also the job's options; ``hashed``:
    the options each chunk's content hash covers (the job's, with ``max_tokens`` as a number)."""
    resolved = {"max_tokens": plan.options.max_tokens}
    if job is None:
        return {**resolved, "tokenizer": plan.source.label}
    options = {key.removeprefix("chunking."): value for key, value in job.chunking.output_options().items()}
    if hashed:
        return {**options, **resolved}
    return {**options, "resolved": {**resolved, "tokenizer": plan.source.label}}
