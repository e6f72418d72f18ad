"""One shard, start to finish: read it, embed it through the senders, write its parts (all or nothing).

A shard is written only when it is true: a document that failed because of the *servers*
(``embed_failed``: 5xx, timeouts, wrong answers) is not a final reject, so a shard holding one writes
nothing and reports how many are left; the run ends incomplete and the same command sends them again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import pickle
import resource
import sys
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import ray

from teibatch.corpus import Document, Reject, Shard, read_shard
from teibatch.crashpoints import crashpoint, task_environment
from teibatch.errors import TeibatchError
from teibatch.pipeline.chunks import ChunkTally, Reused, RowsInOrder, Units, Vector, limit_tokenizer_threads
from teibatch.pipeline.context import ShardContext
from teibatch.pipeline.cycles import no_cycle_collection
from teibatch.pipeline.dedup import ShardCopies, claim_sizes
from teibatch.pipeline.landed import ShardLanded
from teibatch.pipeline.senders.plans import SenderRef
from teibatch.pipeline.senders.sending import embed_through_senders, embedded_in_order
from teibatch.sink import (
    DOCUMENTS_DIR,
    REJECTS_DIR,
    VECTORS_DIR,
    OutputStore,
    VectorSchema,
    VectorsPart,
    read_vectors,
    rejects_table,
    warm_up,
    write_part,
)
from teibatch.tei import EmbedResult
from teibatch.tei.work import RETRYABLE_FAILURES, Failure

# CPU priority of shard tasks (0 normal, 19 lowest): below the senders and local servers. A private Ray
# starts its workers at 0 (``pipeline/ray_runtime.py``); on a cluster whose workers start at Ray's
# default of 15 the tasks stay there, level with the senders (niceness only goes up).
SHARD_TASK_NICENESS = 10


@dataclass(frozen=True)
class ShardOutcome:
    """What a finished shard wrote; the driver commits it to the manifest."""

    shard_id: str
    read: int
    rows: int
    rejects: int
    reused: int = 0
    deduplicated: int = 0  # written with the vector of the same text sent once for another id of the run
    truncated: int = 0  # embedded now from a cut text (the ``truncated`` column), reused ones not counted
    reject_reasons: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    node: str | None = None
    peak_rss_mb: float = 0.0
    unfinished: int = 0
    unfinished_detail: str = ""
    chunks: ChunkTally | None = None  # with chunking: documents, chunks, tokens, chunk lengths
    part_bytes: int = 0  # the vectors part's size, recorded in the manifest
    staged: bool = False  # the parts lie under their staged names, waiting to replace older ones (sink/replace.py)

    @property
    def committable(self) -> bool:
        """True when every document ended as a vector or a final reject (nothing waits for a server)."""
        return self.unfinished == 0


def shard_task(shards: tuple[Shard, ...], context: ShardContext, senders: tuple[SenderRef, ...],
               previous: tuple[tuple[str, ...], ...], staged: tuple[bool, ...] = (),
               ) -> list[ShardOutcome | BaseException]:
    """The Ray task of one or a few consecutive shards: :func:`process_shard` on each, side by side.

    ``previous`` holds, per shard, its earlier parts (see :func:`process_shard`); ``staged``, per
    shard, whether it writes its parts staged (default: none does).

    Small shards are handed out together so that one worker process keeps enough documents on their
    way to fill the servers (starting another Ray worker process takes CPU from the senders). Each shard keeps its
    own outcome: one that raises is returned as its exception, and the others still count.

    With chunking over the servers' ``/tokenize``, the task's counter is closed at its end and what
    it sent is counted in its first chunked outcome (a task whose every shard failed counts none).

    It lives here, not beside the driver's loop, so that a worker unpickling it imports only what a
    shard needs (reading, the senders, Parquet), not the driver's fleet and job-file modules.
    """
    yield_to_senders()
    if context.chunking is not None:
        limit_tokenizer_threads()
    if context.schema.kept or any(previous) or context.moved is not None:
        warm_up_once()
    node = ray.get_runtime_context().get_node_id()
    stage = staged or (False,) * len(shards)
    try:
        with no_cycle_collection():
            if len(shards) == 1:
                outcomes: list[ShardOutcome | BaseException] = [
                    process_shard(shards[0], context, senders, previous[0], stage=stage[0])]
            else:
                with ThreadPoolExecutor(max_workers=len(shards), thread_name_prefix="teibatch-shard") as pool:
                    futures = [pool.submit(process_shard, shard, context, senders, parts, stage=staged_one)
                               for shard, parts, staged_one in zip(shards, previous, stage, strict=True)]
                outcomes = [future.exception() or future.result() for future in futures]
    finally:
        # The servers' /tokenize counter, when the chunker counted with it: closed with the task.
        tokenize = context.chunking.source.release() if context.chunking is not None else None
    counted = next((o.chunks for o in outcomes if isinstance(o, ShardOutcome) and o.chunks is not None), None)
    if counted is not None:  # the task's requests, reported once
        counted.add_tokenize(tokenize)
    return [dataclasses.replace(o, node=node) if isinstance(o, ShardOutcome) else _portable(o) for o in outcomes]


def warm_worker(senders: Sequence[Any] = ()) -> None:
    """A Ray task that readies a worker process for the shard tasks that follow it.

    A worker's first task waits for Ray to load the function and, with it, this module and its
    imports; and a process's first call to an actor waits for Ray to find the actor and connect to
    it (with the actor's handle in a task's arguments, that task started ~140 ms after it was sent,
    on 2 busy cores). This task does both, calling each of ``senders`` once (best effort: a sender
    that is gone is the shard tasks' concern). The driver runs it before it probes the servers
    (``pipeline/opening.py``), so that the first shard tasks start at once on the same worker.
    The worker's priority is left alone: Ray may give the process to a sender next.
    """
    with contextlib.suppress(ray.exceptions.RayError, TimeoutError):
        ray.get([sender.stats.remote() for sender in senders], timeout=30)


def as_shard_work(function: Callable[..., Any]) -> Any:
    """``function`` (:func:`shard_task` or :func:`warm_worker`) as a Ray task: one CPU, the run's task environment.

    Both share these options, or they would not share worker processes.
    """
    # Ray retries a task whose worker died (max_retries); an exception raised by the task is final.
    task = ray.remote(num_cpus=1, max_retries=3, retry_exceptions=False)(function)
    if crash_settings := task_environment():
        task = task.options(runtime_env={"env_vars": crash_settings})
    return task


def _portable(error: BaseException) -> BaseException:
    """``error`` if it survives pickling (Ray returns it to the driver), else a plain error saying the same."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        return TeibatchError(f"{type(error).__name__}: {error}")
    return error


@functools.cache
def warm_up_once() -> None:
    """Start the Parquet side's one-time work in this worker process, beside the embedding.

    A shard's writing comes after its last vector, and at the end of a run the servers wait for it;
    what only has to happen once per process (see :func:`teibatch.sink.warm_up`) need not be there.
    Only a shard with kept fields or earlier parts needs it.
    """
    threading.Thread(target=warm_up, name="teibatch-warm-up", daemon=True).start()


def yield_to_senders() -> None:
    """Lower this process's CPU priority to :data:`SHARD_TASK_NICENESS` (once; niceness only goes up).

    Reading, hashing and writing a shard is throughput work with minutes of slack; the senders'
    turn-around and, with local servers, the servers themselves decide how busy the servers are.
    On a machine with CPU to spare this changes nothing; on a full one the shard tasks wait.
    """
    with contextlib.suppress(OSError):
        if os.getpriority(os.PRIO_PROCESS, 0) < SHARD_TASK_NICENESS:
            os.setpriority(os.PRIO_PROCESS, 0, SHARD_TASK_NICENESS)


def process_shard(shard: Shard, context: ShardContext, senders: tuple[SenderRef, ...],
                  previous_parts: tuple[str, ...] = (), *, stage: bool = False) -> ShardOutcome:
    """Embed ``shard`` and write its ``vectors/`` and ``rejects/`` parts (and ``documents/`` with
    ``chunking.document_vector``); raise if it cannot finish. With chunking, each chunk of a document
    is embedded as its own row (``pipeline/chunks.py``).

    When servers failed some documents (see the module docstring) nothing is written and the
    outcome's ``unfinished`` says how many: the driver does not commit the shard.

    ``previous_parts`` are vectors parts of an earlier run that held this shard's documents; a
    document (or chunk) whose id and content hash are found there keeps its vector and is not sent again,
    as does one whose text ``context.moved`` finds elsewhere in the earlier output.
    With ``context.dedup``, a text another unit of the run sends is not sent again: its vector
    is copied (``pipeline/dedup.py``).
    ``stage``: the shard replaces older parts, so its vectors and documents parts are written under their
    hidden staged names; the driver renames them once the older ones are gone (``sink/replace.py``).
    """
    started = time.monotonic()
    task_started = time.time()  # comparable between the tasks of every node, unlike the monotonic clock
    documents: list[Document] = []
    rejects: list[Reject] = []
    units = Units(context.chunking, context.hash_options)

    # Without chunking a document is one unit: those whose text another shard holds too (the id index
    # knows them) are the only ones the dedup registry is asked about.
    shared = context.ids.shared_texts(shard.id) if context.ids is not None and context.ids.texts \
        and context.dedup is not None and context.chunking is None else None
    contested: set[int] = set()  # of those, the units read so far

    def read_documents() -> Iterator[Document]:
        duplicates = context.ids.duplicates(shard.id) if context.ids is not None else None
        ordinal = 0
        for position, item in enumerate(read_shard(context.corpus, shard, kept=context.kept, duplicates=duplicates)):
            if isinstance(item, Document):
                if shared and position in shared:
                    contested.add(ordinal)
                ordinal += 1
                yield item
            else:
                rejects.append(item)

    store = OutputStore(context.output, context.output_options)
    fresh: Iterable[tuple[int, str]] = units.expand(read_documents(), documents, rejects)
    known: dict[str, tuple[str, Vector, bool]] = {}
    moved: dict[str, tuple[str, Vector, bool]] = {}
    if previous_parts or context.moved is not None:  # which vectors can be kept is known only once every id is
        fresh = list(fresh)
        known = read_vectors(store, previous_parts, set(units.ids), context.schema) if previous_parts else {}
        if context.moved is not None:  # a text found under another id, in other files
            moved = context.moved.find(store, (units.hashes[u] for u, _ in fresh
                                               if known.get(units.ids[u], ("",))[0] != units.hashes[u]),
                                       context.schema)
    to_embed: list[int] = []
    reused: Reused = {}
    copies = ShardCopies(shard.id, units.hashes, context.dedup, contested if shared is not None else None) \
        if context.dedup is not None else None

    def texts_to_embed() -> Iterator[str]:
        batch: list[tuple[int, str]] = []
        sizes = claim_sizes()
        claim = next(sizes)
        for unit, text in fresh:
            previous = known.get(units.ids[unit])
            if previous is not None and previous[0] == units.hashes[unit]:
                reused[unit] = previous
            elif units.hashes[unit] in moved:
                reused[unit] = moved[units.hashes[unit]]
            elif copies is None:
                to_embed.append(unit)
                yield text
            else:
                batch.append((unit, text))
                if len(batch) >= claim:
                    yield from send(batch)
                    batch, claim = [], next(sizes)
        yield from send(batch)

    def send(batch: list[tuple[int, str]]) -> Iterator[str]:
        for unit, text in copies.decide(batch) if copies is not None else batch:
            to_embed.append(unit)
            yield text

    failed: dict[int, Reject] = {}  # by document: its first unit the servers finally refused
    unfinished: list[Failure] = []
    truncated = 0

    def refuse(unit: int, failure: Failure) -> None:
        """``unit``'s document is rejected for ``failure``, unless a unit of it was already."""
        doc = units.doc[unit]
        if doc not in failed:
            failed[doc] = Reject(documents[doc].id, failure.reason, units.describe(unit) + failure.detail)

    def take(units_sent: list[int], result: EmbedResult, *, late: bool = False) -> None:
        """The servers' answers for ``units_sent``: final rejects, failures to send again, what copies them
        (``late``: units another shard was to send, whose vectors are not published again)."""
        nonlocal truncated
        refused = []
        for failure in result.failures:
            unit = units_sent[failure.position]
            if failure.reason in RETRYABLE_FAILURES:
                unfinished.append(failure)
                continue
            refused.append(unit)
            refusals[unit] = failure
            refuse(unit, failure)
        truncated += int(np.count_nonzero(result.truncated & result.ok))
        if copies is not None:
            copies.landed(units_sent, result.vectors, result.ok, result.truncated, refused,
                          publish=not late)

    refusals: dict[int, Failure] = {}
    held: deque[tuple[list[int], EmbedResult]] = deque()  # results waiting for copies before them
    landed = ShardLanded(context.landed, shard.id)
    try:
        with VectorsPart(context.schema, context.write) as part:
            rows = RowsInOrder(part, context.schema, documents, units, reused,
                               copies.copies if copies is not None else None,
                               copies.late if copies is not None else None)

            def hand_over() -> None:
                """Results whose units, and every copy before them, are final, to the part (in order)."""
                while held and not unfinished and (copies is None or copies.final_through(held[0][0][-1])):
                    rows.add(*held.popleft())

            # Reading streams into the senders (the first chunk is on its way before the shard is read), and
            # the vectors into the part as they come back: after the last one, only its last group is left.
            for start, result in embedded_in_order(texts_to_embed(), senders, priority=task_started,
                                                   stream=shard.id):
                positions = to_embed[start:start + len(result.ok)]
                take(positions, result)
                if positions:  # results come in unit order: every document before this unit's has its vectors
                    landed.to(units.doc[positions[-1]])
                if positions and not unfinished:  # else nothing is written: the part is not worth encoding
                    held.append((positions, result))
                    hand_over()
                    if held and copies is not None and copies.waiting:
                        copies.peek()
                        hand_over()
            if copies is not None and not unfinished:
                late = copies.wait()  # what other shards sent for this one; the rest it sends itself
                if late:
                    take([unit for unit, _ in late], embed_through_senders(
                        [text for _, text in late], senders, context.schema.dimension, priority=task_started),
                        late=True)
                hand_over()
            read = len(documents) + len(rejects)
            if unfinished:
                return ShardOutcome(shard_id=shard.id, read=read, rows=0, rejects=0, reused=len(reused),
                                    seconds=time.monotonic() - started, peak_rss_mb=peak_rss_mb(),
                                    unfinished=len(unfinished),
                                    unfinished_detail=f"{unfinished[0].reason}: {unfinished[0].detail}")
            if held:
                raise RuntimeError(f"shard {shard.id}: {len(held)} results still wait for copies of other texts")
            rows.finish()
            if copies is not None:  # a copy of a text the servers refused is refused the same way
                for copy, first in copies.refused.items():
                    refuse(copy, refusals[first])
                truncated += sum(1 for _, _, cut in copies.copies.values() if cut)
            rejects += failed.values()
            # Rejects first, then the documents part: the vectors part is the one a reader sees, so it comes last.
            write_part(store, REJECTS_DIR, shard.id, rejects_table([r.id for r in rejects],
                                                                   [r.reason for r in rejects],
                                                                   [r.detail for r in rejects]), context.write)
            if context.chunking is not None and context.chunking.document_vector:
                write_part(store, DOCUMENTS_DIR, shard.id, _documents_part(context.schema, rows.document_rows),
                           context.write, staged=stage)
            crashpoint("shard-write")
            part.commit(store, VECTORS_DIR, shard.id, staged=stage)
    finally:
        if copies is not None:
            copies.release()
    if context.chunking is not None:
        rows.tally.document_tokens = units.document_tokens
    return ShardOutcome(
        shard_id=shard.id, read=read, rows=part.rows, rejects=len(rejects), reused=len(reused), truncated=truncated,
        deduplicated=rows.deduplicated, reject_reasons=dict(Counter(r.reason for r in rejects)),
        seconds=time.monotonic() - started, peak_rss_mb=peak_rss_mb(),
        chunks=rows.tally if context.chunking is not None else None, part_bytes=part.bytes, staged=stage,
    )


def _documents_part(schema: VectorSchema, tables: list[pa.Table]) -> pa.Table:
    """The documents part of a shard from its tables (an empty one when no document was written)."""
    return pa.concat_tables(tables) if tables else schema.documents_arrow().empty_table()


def peak_rss_mb() -> float:
    """This process's peak resident memory so far, in MiB (Linux reports KiB, macOS bytes)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return round(peak / (1024 * 1024 if sys.platform == "darwin" else 1024), 1)

