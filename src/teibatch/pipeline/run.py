"""The driver: plan → fleet up → shards on Ray → commit → report → fleet down."""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Sequence
from contextlib import AbstractContextManager, ExitStack, nullcontext
from dataclasses import dataclass, field
from typing import Any

import ray

from teibatch.corpus import CorpusProbe, KeptFields, Shard, plan_shards, probe_corpus
from teibatch.corpus.overlap import exclusion_note
from teibatch.crashpoints import crashpoint
from teibatch.endpoint import Endpoint
from teibatch.errors import (
    CapacityUnavailable,
    CorpusMismatch,
    DimensionMismatch,
    JobSpecError,
    RunIncomplete,
    StorageFull,
    TeiAuthError,
    TeibatchError,
    WrongModelKind,
)
from teibatch.fleet import Capability, Provider, supports
from teibatch.job import JobSpec
from teibatch.native_stderr import quiet_native
from teibatch.pipeline.calibration import output_quantization
from teibatch.pipeline.chunking_setup import CounterSource, chunk_plan, chunking_info, early_counter
from teibatch.pipeline.chunks import ChunkTally
from teibatch.pipeline.connect import Fleet, connect
from teibatch.pipeline.context import ShardContext
from teibatch.pipeline.interrupts import Interrupts, catch_interrupts, reinstall
from teibatch.pipeline.kept_types import output_kept_fields
from teibatch.pipeline.landed import LandedPoll
from teibatch.pipeline.moved_texts import index_moved_texts
from teibatch.pipeline.opening import EarlyActors, Opening, server_limits
from teibatch.pipeline.plan import check_cost_limit, estimate_run
from teibatch.pipeline.plan_chunks import chunks_per_document
from teibatch.pipeline.progress import InShardProgress, Reporter, Reporters, SilentReporter
from teibatch.pipeline.ramp import FIRST_TASK_ALONE_S, TaskRamp
from teibatch.pipeline.ray_runtime import RayStart, ray_session
from teibatch.pipeline.replacements import ServerWatch, meet_replacements
from teibatch.pipeline.run_fleet import fleet_record, fleet_session, job_provider
from teibatch.pipeline.same_output import check_vector_kind, open_manifest
from teibatch.pipeline.senders.actor import sender_news
from teibatch.pipeline.senders.plans import SenderRef
from teibatch.pipeline.senders.sending import last_streams, streams_done
from teibatch.pipeline.shard import ShardOutcome, as_shard_work, shard_task
from teibatch.pipeline.storage_full import end_storage_full, report_refused, with_estimate
from teibatch.pipeline.summary import RunSummary, SummaryRecorder, new_run_id
from teibatch.pipeline.unique_ids import IdIndex, IndexProgress, build_id_index, needs_id_index, stored_id_index
from teibatch.sink import (
    Manifest,
    OutputLock,
    OutputStore,
    Replacements,
    VectorSchema,
    WriteOptions,
    check_parts,
    remove_stale,
    remove_uncommitted_temp,
)
from teibatch.sink import write_report as save_report
from teibatch.sink.parts import part_name
from teibatch.sparse import KIND_DENSE, KIND_SPARSE
from teibatch.tei import EmbedOptions

log = logging.getLogger(__name__)

# Errors that would fail every other shard the same way: stop the run at once.
FATAL_ERRORS = (TeiAuthError, WrongModelKind, CapacityUnavailable)
# How often the driver passes on what the senders saw (retries, servers taken out).
NEWS_INTERVAL_S = 5.0
LANDED_POLL_S = 1.0
"""How often the driver takes the documents landed in running shards (one small actor call)."""
INDEX_PROGRESS_S = 10.0
"""How often, at most, the id index's reading says how far it got (as the plain progress lines do)."""
# Shard tasks per sender beyond those that fill its budget, when the job leaves it to teibatch (see _tasks_in_flight).
SPARE_TASKS_PER_SENDER = 1
# The most shards one task processes side by side (see _tasks).
MAX_SHARDS_PER_TASK = 16
SAVE_SPACING = 19
"""After a manifest write of t seconds, the next waits at least this many times t (at most 5% of the
driver's time goes to them): every commit rewrites the whole manifest, which grows with the shards
(10,000 shards: 2.7 MB, 35 ms on a local disk, more on object storage), so a write per shard would
grow quadratically with the corpus. Shards that finish meanwhile are written together."""


def run_job(job: JobSpec, *, ray_address: str | None = None, reporter: Reporter | None = None,
            run_id: str | None = None) -> RunSummary:
    """Run ``job`` to completion; raise :class:`RunIncomplete` (after writing the report) if shards remain.

    ``run_id``: this run's id when the caller made it (to name the run in its logs from the first line).
    """
    summary = RunSummary(run_id=run_id or new_run_id())
    reporter = Reporters(SummaryRecorder(summary), reporter or SilentReporter())
    reporter.bind(summary.run_id)
    started = time.monotonic()
    store = OutputStore(job.output.path, job.output.storage_options)
    provider = job_provider(job)  # checks the servers section (API key variable set) before any work
    corpus = job.corpus_options()  # an output that is the corpus, or holds it, stops here
    probe = probe_corpus(corpus)  # a corpus that does not fit the job stops here, before any server
    if (note := exclusion_note(corpus)) is not None:
        reporter.message(note, event="output_left_out")
    summary.left_out = probe.left_out
    if probe.left_out.total:
        reporter.message(f"corpus: {probe.left_out.describe()}", event="corpus_left_out",
                         **probe.left_out.to_json())
    lock = OutputLock(store, summary.run_id)
    try:
        store.check_writable()  # before anything starts: an unwritable output is found now, not after the work
        lock.acquire()  # another run writing this output: OutputLocked, and this run has written nothing
    except StorageFull as exc:  # nothing is started, and no report written: the run has not begun
        raise with_estimate(exc, job, store, None, None) from None
    try:
        if lock.took_over is not None:
            reporter.message(f"took over the lock of {lock.took_over.describe()}: that run is gone",
                             event="lock_taken_over", previous_run_id=lock.took_over.run_id)
        return _run_locked(job, ray_address, reporter, summary, started, store, provider, lock, probe)
    finally:
        lock.release()


def _run_locked(job: JobSpec, ray_address: str | None, reporter: Reporter, summary: RunSummary, started: float,
                store: OutputStore, provider: Provider, lock: OutputLock, probe: CorpusProbe) -> RunSummary:
    """The run, once it holds the output's lock: every manifest write first checks it still does."""
    manifest = open_manifest(store, job, reporter)
    check_vector_kind(store, manifest, job.model.kind)
    manifest.guard = lock.check
    manifest.runs.append(summary.run_id)
    shards: list[Shard] = []
    live: set[str] = set()
    try:
        # From here on a run is under way: whatever happens, even a Ctrl-C while planning, it ends
        # with a report and with the manifest as it stands.
        with catch_interrupts() as interrupts, ExitStack() as ray_scope:
            if job.limits.max_cost is not None:
                check_cost_limit(job, estimate_run(job))  # over the limit: refused before anything is rented
            shards = plan_shards(job.corpus_options())
            live = {s.id for s in shards}
            manifest.planned = [s.id for s in shards]
            replacements = Replacements(manifest, {s.id: s.sources for s in shards})
            crashpoint("plan")
            remove_uncommitted_temp(store, manifest)
            replacements.finish(store)  # what a killed run left half-replaced, first (sink/replace.py)
            _drop_missing_parts(store, manifest, live, summary, reporter)
            summary.timings["plan_s"] = time.monotonic() - started
            ids, ray_start, early = _id_index(job, store, shards, manifest, ray_address, ray_scope, summary,
                                              reporter)
            pending = [s for s in shards if not _done(s, manifest, ids)]
            summary.shards_total, summary.shards_skipped = len(shards), len(shards) - len(pending)
            if summary.shards_skipped:
                reporter.message(f"resuming: {summary.shards_skipped} of {len(shards)} shards already committed",
                                 event="resuming", shards_committed=summary.shards_skipped, shards_total=len(shards))
            interrupts.check()
            if pending:
                kept = output_kept_fields(job, probe, shards, manifest, store.url, reporter)
                # Ray starts in the background while the servers start; the senders wait for it.
                if ray_start is None:
                    ray_start = ray_scope.enter_context(ray_session(ray_address, summary))
                run = Run(job, provider, store, manifest, summary, reporter, interrupts, replacements, live, ids)
                run.embed(pending, ray_start, kept, early)
            interrupts.check()
        summary.status = "done" if not summary.shards_failed else "incomplete"
    except (KeyboardInterrupt, SystemExit):
        # SystemExit: a SIGTERM handled by a library's own handler (ray.init installs one that exits when it
        # runs on the main thread) must still end with an honest report.
        quiet_native()
        summary.status = "interrupted"
        summary.errors.append("interrupted (Ctrl-C or SIGTERM)")
    except StorageFull as exc:  # written nowhere else: a shard's own is caught by Run.finish
        summary.storage_full = exc
    except TeibatchError as exc:
        summary.status = "failed"
        summary.errors.append(str(exc))
        raise
    finally:
        with catch_interrupts():  # a second Ctrl-C must not cut the report short
            reporter.stop()
            try:
                if summary.status == "done":
                    lock.check()  # parts are removed only by the run that holds the output
                    remove_stale(store, manifest, live)
                if manifest.planned:
                    manifest.save(store)  # on a full disk the old manifest stays, whole
            except StorageFull as exc:
                summary.storage_full = summary.storage_full or exc
            if summary.storage_full is not None:
                end_storage_full(job, store, manifest, shards, summary)
            summary.timings["total_s"] = time.monotonic() - started
            report = summary.to_json()
            try:
                save_report(store, summary.run_id, report)
            except StorageFull as exc:
                summary.storage_full = summary.storage_full or report_refused(store, report, exc)
            reporter.finish(report)
    if summary.storage_full is not None:
        raise summary.storage_full
    if summary.corpus_errors:
        raise CorpusMismatch(f"{len(summary.corpus_errors)} shard(s) could not be read, the others are committed: "
                             f"{summary.corpus_errors[0]}; fix the file(s) and run the same command again")
    if summary.status != "done":
        missing = len(shards) - len(manifest.shards.keys() & live)
        first = f" (first error: {summary.errors[0]})" if summary.errors else ""
        raise RunIncomplete(f"{summary.status}: {missing} of {len(shards)} shards are not committed{first}; "
                            "run the same command again to finish them")
    _refuse_all_rejected(summary)
    return summary


def _refuse_all_rejected(summary: RunSummary) -> None:
    """A run that read documents and rejected every one of them did not do what its user meant."""
    if not summary.documents_read or summary.embedded or summary.reused:
        return
    if summary.rejected_total != summary.documents_read:
        return
    reasons = ", ".join(f"{reason}: {count}" for reason, count in summary.rejected.most_common())
    hint = (" — is corpus.text_field the field that holds the text?" if "missing_text" in summary.rejected
            else "")
    raise CorpusMismatch(f"every one of the {summary.documents_read} documents read was rejected ({reasons}){hint}; "
                         "see the rejects/ folder of the output. Fix the job and run it again: an output that holds "
                         "no vectors accepts other reading options")


def _drop_missing_parts(store: OutputStore, manifest: Manifest, live: set[str], summary: RunSummary,
                        reporter: Reporter) -> None:
    """Uncommit the planned shards whose vectors part is gone or not the size recorded: this run embeds them
    again (a part deleted by hand would otherwise stay missing for good)."""
    check = check_parts(store, manifest, sorted(live))
    if not check.bad:
        return
    for shard_id in check.bad:
        del manifest.shards[shard_id]
    summary.parts_missing = [part_name(sid) for sid in check.bad]
    problems = ", ".join(f"{len(ids)} {what}" for what, ids in (("missing", check.missing),
                                                                   ("not the size recorded", check.wrong_size)) if ids)
    reporter.message(f"{len(check.bad)} committed vectors part(s) are not in the output as recorded ({problems}: "
                     f"{', '.join(summary.parts_missing[:5])}); their shards are embedded again",
                     event="parts_missing", parts=summary.parts_missing)


def _id_index(job: JobSpec, store: OutputStore, shards: list[Shard], manifest: Manifest, ray_address: str | None,
              ray_scope: ExitStack, summary: RunSummary,
              reporter: Reporter) -> tuple[IdIndex | None, RayStart | None, EarlyActors | None]:
    """Which documents lose their id to an earlier shard of the plan (``pipeline/unique_ids.py``):
    the index an earlier run built for this plan, else one built now, before any server starts
    (nobody pays for a GPU while the corpus's ids are read) with a Ray started in ``ray_scope``.
    While it is read, where some shard is still to embed, the run's actors start (:class:`EarlyActors`,
    stopped as ``ray_scope`` ends)."""
    output_options = dict(job.output.storage_options)
    texts = job.corpus.deduplicate and not job.chunking.enabled  # then a document is one text: index them too
    if (ids := stored_id_index(store, output_options, shards, texts)) is not None \
            or not needs_id_index(job.corpus_options(), shards, texts):
        return ids, None, None
    clock = time.monotonic()
    ray_start = ray_scope.enter_context(ray_session(ray_address, summary))
    ray_start.wait()
    pending = sum(1 for s in shards if s.id not in manifest.shards)
    early = EarlyActors.start(job, index_coming=True) if pending else None
    if early is not None:
        ray_scope.callback(early.stop)
    reporting = IndexReporting(reporter)
    ids = build_id_index(store, output_options, job.corpus_options(), shards, texts, reporting)
    if early is not None:
        early.index_read(job, ids, pending)
    summary.timings["id_index_s"] = time.monotonic() - clock
    if ids is not None:
        reporting.built(ids)
    return ids, ray_start, early


class IndexReporting(IndexProgress):
    """The id index's reading told to ``reporter``: what it reads as it starts, then how far it got every
    :data:`INDEX_PROGRESS_S` seconds (a corpus of a hundred million documents takes minutes)."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.documents = 0
        self._started: float | None = None
        self._due = 0.0

    def reading(self, documents: int, shards: int) -> None:
        self.documents = documents
        self._started = started = time.monotonic()
        self._due = started + INDEX_PROGRESS_S
        self.reporter.message(f"reading the ids of {documents:,} documents in {shards} shards, to find ids that "
                              "repeat across shards (once per corpus: resumed runs reuse the index)",
                              event="id_index_started", documents=documents, shards=shards)

    def read(self, documents: int) -> None:
        if documents < self.documents and time.monotonic() >= self._due:
            self._due = time.monotonic() + INDEX_PROGRESS_S
            self.reporter.message(f"ids read: {documents:,}/{self.documents:,} documents", event="id_index_progress",
                                  documents_read=documents, documents_total=self.documents)

    def built(self, ids: IdIndex) -> None:
        """The index is whole: how long it took since :meth:`reading`, and what it found (nothing when
        nothing was read: the output held it)."""
        if self._started is None:
            return
        seconds = time.monotonic() - self._started
        losing = ids.losing_documents
        found = (f"{losing:,} record(s) repeat an id an earlier shard holds: they are rejected as duplicate_id"
                 if losing else "no id repeats across shards")
        self.reporter.message(f"id index built in {seconds:.1f}s: {found}", event="id_index_built",
                              seconds=round(seconds, 3), duplicates=losing)


def _done(shard: Shard, manifest: Manifest, ids: IdIndex | None) -> bool:
    """Whether ``shard`` is committed, and lost to earlier shards the ids it loses now (a new earlier
    file holding one of its ids, or one removed, makes it run again)."""
    entry = manifest.shards.get(shard.id)
    return entry is not None and entry.duplicates == (ids.decision(shard.id) if ids is not None else "")


@dataclass
class Run:
    """One run once it holds the output's lock and has a plan: what its phases share, and the phases.

    :meth:`embed` takes the pending shards through the fleet, the opening, the schedule and each
    shard's commit (:meth:`finish`); ``live``: the planned shards' ids; ``ids``: which documents lose
    their id to an earlier shard (``pipeline/unique_ids.py``), ``None`` when no id repeats.
    """

    job: JobSpec
    provider: Provider
    store: OutputStore
    manifest: Manifest
    summary: RunSummary
    reporter: Reporter
    interrupts: Interrupts
    replacements: Replacements
    live: set[str]
    ids: IdIndex | None = None
    _stale: Manifest = field(init=False, repr=False)
    _unsaved: list[tuple[Shard, ShardOutcome, Reporter]] = field(default_factory=list, init=False, repr=False)
    _next_save: float = field(default=0.0, init=False, repr=False)

    def __post_init__(self) -> None:
        manifest = self.manifest
        self._stale = Manifest(manifest.fingerprint, manifest.job_name,
                               shards={sid: e for sid, e in manifest.shards.items() if sid not in self.live})

    def previous(self, shard: Shard) -> tuple[str, ...]:
        """Incremental mode: where an earlier run wrote the documents of ``shard``, which changed."""
        return tuple(self._stale.parts_reading(shard.sources)) if self.job.mode == "incremental" else ()

    def embed(self, pending: list[Shard], ray_start: RayStart, kept: KeptFields | None,
              early: EarlyActors | None = None) -> None:
        """The run's phases: fleet → opening (warm-up, the servers met and probed, senders) → schedule → finish.

        ``early``: the run's actors, started before (:class:`EarlyActors`); without them, and with
        Ray up already, they are started now, while the servers come up.
        """
        job, provider, summary, reporter, interrupts = self.job, self.provider, self.summary, self.reporter, \
            self.interrupts
        options = EmbedOptions(normalize=job.model.normalize, truncate=job.model.truncate,
                               truncation_direction=job.model.truncation_direction,
                               prompt_name=job.model.prompt_name, dimensions=job.model.dimensions,
                               on_too_long=job.model.on_too_long, kind=job.model.kind)
        counter = early_counter(job)  # a tokenizer that cannot be found stops the run before any server starts
        per_document = chunks_per_document(job, pending)  # what a document sends: tasks are sized by it
        if supports(provider, Capability.SWEEP):
            ray_start.wait()  # rented or remote hosts: nobody pays for them while Ray may still fail to start
        if ray_start.ready:  # the actors' and the first workers' processes start while the servers do
            early = early or EarlyActors.start(job, ids=self.ids, pending=len(pending))
            early.warm_workers(len(pending))
        clock = time.monotonic()
        try:
            with fleet_session(job, provider, summary.run_id) as endpoints:
                interrupts.check()
                reporter.message(f"{len(endpoints)} {provider.name} server(s) ready", event="servers_ready",
                                 servers=len(endpoints), provider=provider.name)
                up_s = time.monotonic() - clock
                ray_start.wait()
                reinstall(interrupts)
                interrupts.check()
                if early is None:  # Ray came up after the servers: the registries start with the senders
                    early = EarlyActors.start(job, senders=False, ids=self.ids, pending=len(pending))
                opening = Opening(job, options, endpoints, len(pending), early.senders, early.workers)
                early.senders = []  # the opening's now: it stops them
                context: ShardContext | None = None
                try:
                    met = time.monotonic()
                    fleet = opening.meet()
                    self.check_same_vectors(fleet)  # servers the output cannot take get no work
                    senders = opening.send(fleet)
                    clock = time.monotonic()
                    context = self.shard_context(fleet, counter, kept, pending, senders, early)
                    waited = opening.wait_for_workers()
                    # Meeting the servers, less the opening's waits for its processes (made between /info and
                    # the probe); what the warm-up added: its start and those waits.
                    summary.timings["fleet_up_s"] = up_s + clock - met - (opening.waited - waited)
                    summary.timings["warm_up_s"] = met - opening.started + opening.waited
                    reporter.start(len(pending), sum(s.size for s in pending))
                    with self.server_watch(fleet, options, senders):
                        self.schedule(_tasks(job, senders, pending, per_document), context, tuple(senders),
                                      opening.one_machine, per_document)
                    summary.timings["embed_s"] = time.monotonic() - clock - waited
                finally:
                    summary.servers = opening.close()
        finally:  # after teardown: the instances' whole time
            if early is not None:  # what no opening took, and the registries (the dedup registry's vectors go)
                early.stop()
            summary.cost, steps = fleet_record(provider, summary.run_id, summary.started_at)
            summary.events = sorted(summary.events + steps, key=lambda event: event["t"])

    def shard_context(self, fleet: Fleet, counter: CounterSource | None, kept: KeptFields | None,
                      pending: list[Shard], senders: Sequence[SenderRef], early: EarlyActors) -> ShardContext:
        """What every shard task is given, fixed once the servers are known: the chunking plan, the output's
        metadata (also the manifest's), the int8/uint8 ranges, the run's registries (``early``'s)."""
        job, manifest, summary = self.job, self.manifest, self.summary
        chunking = chunk_plan(job, fleet, counter, [server_limits(job, s) for s in fleet.servers]) \
            if job.chunking.enabled else None
        size = {"kind": KIND_SPARSE, "vocab_size": fleet.dimension} if fleet.sparse else {"dimension": fleet.dimension}
        manifest.info = {"model_id": fleet.model_id, **size, "route": fleet.route,
                         "servers": [s.info.to_json() for s in fleet.servers],
                         **({"chunking": chunking_info(chunking)} if chunking is not None else {})}
        if chunking is not None:
            summary.chunking = ChunkTally()
            summary.tokenizer = chunking.source.label
        # int8/uint8: the ranges are fixed before any shard runs, from the manifest or a first sample.
        try:
            quantization = output_quantization(job.output.vector_type, manifest, pending, job.corpus_options(),
                                               chunking, senders, self.reporter)
        finally:
            if chunking is not None and summary.chunking is not None:  # the plan's check, the calibration's
                summary.chunking.add_tokenize(chunking.source.release())
        # Incremental, with dedup: shards look their texts up by content hash in the whole earlier output.
        looks_up_moved = job.mode == "incremental" and job.corpus.deduplicate and bool(manifest.shards)
        moved = index_moved_texts(self.store, manifest) if looks_up_moved else None
        corpus = job.corpus_options()
        options = {**job.vector_options(), "model": fleet.model_id}
        if fleet.sparse:  # in the content hash too: a sparse vector is not a dense one (dense outputs keep theirs)
            options["kind"] = KIND_SPARSE
        metadata: dict[str, Any] = {"model_id": fleet.model_id, "options": options, "job": job.name}
        hash_options = options
        if chunking is not None:  # a chunk's hash covers the chunking options too
            metadata["chunking"] = chunking_info(chunking, job)
            hash_options = {**options, "chunking": chunking_info(chunking, job, hashed=True)}
        schema = VectorSchema(dimension=fleet.dimension, vector_type=job.output.vector_type,
                              quantization=quantization, keep_float=job.output.keep_float,
                              kept=dict(kept.types) if kept is not None else {}, metadata=metadata,
                              chunks=chunking is not None, chunk_text=chunking is not None and chunking.store_text,
                              sparse=fleet.sparse)
        return ShardContext(corpus=corpus, hash_options=hash_options, schema=schema,
                            write=WriteOptions(job.output.compression, job.output.row_group_size),
                            output=job.output.path, output_options=dict(job.output.storage_options), kept=kept,
                            chunking=chunking, dedup=early.dedup, moved=moved, ids=self.ids,
                            landed=senders[0].actor if senders else None)

    def server_watch(self, fleet: Fleet, options: EmbedOptions,
                     senders: Sequence[SenderRef]) -> AbstractContextManager[object]:
        """For a provider whose servers the cloud may take back mid-run: the watch that replaces them."""
        job = self.job
        if not supports(self.provider, Capability.REPLACE):
            return nullcontext()

        def meet_one(endpoints: list[Endpoint]) -> Fleet:
            return connect(endpoints, options, requested_route=fleet.route, expected_model=job.model.id,
                           api_key_env=job.servers.api_key_env, timeout=job.client.request_timeout)

        meet = meet_replacements(meet_one, lambda server: server_limits(job, server), fleet.model_id, fleet.dimension)
        return ServerWatch(self.provider, senders, meet, self.reporter, self.summary)

    def check_same_vectors(self, fleet: Fleet) -> None:
        """The first commit fixes the output's model, kind and dimension; servers that differ stop the run
        here, as does a job with options sparse vectors do not take when the servers turn out to give them."""
        job, manifest, store = self.job, self.manifest, self.store
        if fleet.sparse and (conflicts := job.sparse_conflicts()):
            raise JobSpecError(f"the servers serve {fleet.model_id}, a SPLADE model (model.kind: {job.model.kind}): "
                               f"{conflicts[0]}", key="model.kind")
        check_vector_kind(store, manifest, KIND_SPARSE if fleet.sparse else KIND_DENSE)
        if not manifest.shards or not manifest.info:
            return
        dimension = manifest.info.get("vocab_size" if fleet.sparse else "dimension")
        model = manifest.info.get("model_id")
        if dimension not in (None, fleet.dimension) or model not in (None, fleet.model_id):
            raise DimensionMismatch(
                f"{store.url} holds {dimension}-dimension vectors of {model}, but the servers give {fleet.dimension}-"
                f"dimension vectors of {fleet.model_id}; point the job at servers with the output's model, or write "
                "to a new output.path")

    def schedule(self, tasks: list[tuple[Shard, ...]], context: ShardContext, senders: tuple[SenderRef, ...],
                 one_machine: bool, per_document: float = 1.0) -> None:
        """Keep shard tasks running; commit each shard as its task finishes; pass on what the senders report.

        ``per_document``: the inputs a document sends (its chunks), as for :func:`_tasks`.
        """
        job, summary = self.job, self.summary
        task = as_shard_work(shard_task)
        context_ref = ray.put(context)
        progress = InShardProgress(self.reporter)  # documents count as they land, not only as shards end
        landed = LandedPoll(context.landed)
        queue = list(reversed(tasks))
        in_flight = _tasks_in_flight(job, senders, queue, per_document)
        alone_s = FIRST_TASK_ALONE_S if one_machine else 0.0
        ramp = TaskRamp(in_flight, os.cpu_count() or 1, time.monotonic(), alone_s=alone_s)
        running_refs: dict[ray.ObjectRef, tuple[Shard, ...]] = {}
        deadline = time.monotonic() + job.limits.max_runtime if job.limits.max_runtime else None
        news_due = time.monotonic() + NEWS_INTERVAL_S
        last_started = False  # the senders know which shards are the last ones (their tail hedging waits for it)
        try:
            while queue or running_refs:
                self.interrupts.check()
                ramp.tick(time.monotonic())
                while queue and len(running_refs) < ramp.allowed:
                    shards = queue.pop()
                    parts = tuple(self.previous(s) for s in shards)
                    staged = tuple(self.replacements.supersedes(s.id) for s in shards)
                    running_refs[task.remote(shards, context_ref, senders, parts, staged)] = shards
                    for shard in shards:
                        progress.started(shard.id, shard.size)
                if not queue and not last_started:
                    last_streams(senders, (s.id for shards in running_refs.values() for s in shards))
                    last_started = True
                now = time.monotonic()
                if deadline is not None and now >= deadline:
                    summary.errors.append(f"limits.max_runtime ({job.limits.max_runtime:.0f}s) reached")
                    summary.shards_failed += sum(len(shards) for shards in [*running_refs.values(), *queue])
                    return
                if now >= news_due:
                    for line in sender_news(senders):
                        progress.message(line, event="server_fault")
                    news_due = now + NEWS_INTERVAL_S
                progress.landed(landed.take())
                self.save_commits(due_only=True)
                wait = min(LANDED_POLL_S, deadline - now) if deadline is not None else LANDED_POLL_S
                if self._unsaved:
                    wait = min(wait, self._next_save - now)
                if (to_change := ramp.seconds_to_change(now)) is not None:
                    wait = min(wait, to_change)
                done, _ = ray.wait(list(running_refs), num_returns=1, timeout=max(0.0, wait))
                for ref in done:
                    shards = running_refs.pop(ref)
                    ramp.task_finished(time.monotonic())
                    if last_started:  # also for a task that died before it could say so itself
                        streams_done(senders, (s.id for s in shards))
                    if context.dedup is not None:  # what its shards still own, however the task ended
                        context.dedup.release(s.id for s in shards)
                    try:
                        outcomes: list[ShardOutcome | BaseException] = ray.get(ref)
                    except Exception as exc:  # the task itself failed (its worker died too often): every shard of it
                        outcomes = [exc] * len(shards)
                    for shard, outcome in zip(shards, outcomes, strict=True):
                        self.finish(shard, outcome, progress,
                                    context.ids.decision(shard.id) if context.ids is not None else "")
                if summary.storage_full is not None:  # every other write would be refused the same way
                    summary.shards_failed += sum(len(shards) for shards in [*running_refs.values(), *queue])
                    return
        finally:
            try:
                self.save_commits()  # however the run ends, the shards it finished are committed
            finally:
                for ref in running_refs:
                    ray.cancel(ref, force=True)

    def finish(self, shard: Shard, outcome: ShardOutcome | BaseException, reporter: Reporter,
               duplicates: str = "") -> None:
        """Commit a finished shard, or count it as not done (and say why, to ``reporter``); then, once its group
        is all committed, the parts it replaces go and its own take their place (``sink/replace.py``);
        ``duplicates``: which of its documents lost their id to an earlier shard (``IdIndex.decision``),
        recorded with it."""
        summary, manifest = self.summary, self.manifest
        if isinstance(outcome, BaseException):
            cause = getattr(outcome, "cause", outcome)  # a Ray task error carries the task's own
            if isinstance(cause, FATAL_ERRORS):
                raise cause from None
            summary.shards_failed += 1
            if isinstance(cause, CorpusMismatch):
                summary.corpus_errors.append(str(cause))
            if isinstance(cause, StorageFull):
                summary.storage_full = summary.storage_full or cause
            summary.errors.append(f"shard {shard.id}: {_cause(outcome)}")
            reporter.message(f"shard {shard.id} failed: {_cause(outcome)}", event="shard_failed", shard=shard.id)
            reporter.advance(1, shard.size, shard=shard.id, status="failed")
            return
        if not outcome.committable:
            summary.shards_failed += 1
            summary.unfinished += outcome.unfinished
            message = (f"shard {shard.id}: {outcome.unfinished} document(s) failed on the servers "
                       f"({outcome.unfinished_detail}); not committed, the same command sends them again")
            summary.errors.append(message)
            reporter.message(message, event="shard_not_committed", shard=shard.id, unfinished=outcome.unfinished)
            reporter.advance(1, shard.size, shard=shard.id, status="not_committed")
            return
        manifest.commit(shard.id, outcome.rows, outcome.rejects, summary.run_id, shard.sources,
                        bytes=outcome.part_bytes, staged=outcome.staged, duplicates=duplicates)
        self._unsaved.append((shard, outcome, reporter))
        self.save_commits(due_only=True)

    def save_commits(self, *, due_only: bool = False) -> None:
        """Write the manifest for the shards :meth:`finish` committed since the last write; only then do they
        count as committed (their replaced parts go, the summary and progress count them). ``due_only``:
        not before :data:`SAVE_SPACING` allows."""
        unsaved = self._unsaved
        if not unsaved or (due_only and time.monotonic() < self._next_save):
            return
        self._unsaved = []
        started = time.monotonic()
        try:
            self.manifest.save(self.store)
        except StorageFull as exc:  # the manifest on disk, whole, lists none of them: they are not committed
            for shard, _, _ in unsaved:
                del self.manifest.shards[shard.id]
            for shard, _, reporter in unsaved:
                self.finish(shard, exc, reporter)
            return
        finished = time.monotonic()
        self._next_save = finished + SAVE_SPACING * (finished - started)
        for shard, outcome, reporter in unsaved:
            crashpoint("commit")
            self.replacements.finish(self.store, [shard.id])
            self.summary.add(outcome)
            reporter.advance(1, shard.size, shard=shard.id, status="committed", rows=outcome.rows,
                             rejects=outcome.rejects)


def _tasks(job: JobSpec, senders: Sequence[SenderRef], pending: Sequence[Shard],
           per_document: float = 1.0) -> list[tuple[Shard, ...]]:
    """The pending shards as Ray tasks: one shard each, or consecutive small shards together.

    Shards smaller than the senders' whole budget (in inputs: a shard sends ``per_document`` a
    document, its chunks with chunking) go together, up to ``MAX_SHARDS_PER_TASK``, until a task
    holds the budget: a few worker processes then keep the servers full, where one process per
    small shard would spend CPU starting each and leave the servers waiting. A task's shards commit
    when it ends, so a task holds no more than that: a kill re-sends about a task's worth. A job
    that sets ``limits.max_shards_in_flight`` gets one shard a task.
    """
    if job.limits.max_shards_in_flight != "auto":
        return [(shard,) for shard in pending]
    budget = sum(s.budget for s in senders)
    tasks: list[tuple[Shard, ...]] = []
    group: list[Shard] = []
    inputs = 0.0
    for shard in pending:
        group.append(shard)
        inputs += shard.size * per_document
        if inputs >= budget or len(group) == MAX_SHARDS_PER_TASK:
            tasks.append(tuple(group))
            group, inputs = [], 0.0
    if group:
        tasks.append(tuple(group))
    return tasks


def _tasks_in_flight(job: JobSpec, senders: Sequence[SenderRef], tasks: Sequence[tuple[Shard, ...]],
                     per_document: float = 1.0) -> int:
    """Shard tasks at once: the job's number, else enough to keep every sender fed and no more.

    Enough: the tasks together hold the senders' whole budget in inputs (``per_document`` a
    document), and each sender has
    ``SPARE_TASKS_PER_SENDER`` more reading its shards while the others finish and write, so the
    senders never wait. More would only compete with the servers and the senders for CPU — on a
    machine whose Ray declares more CPUs than it has, that slows the run down instead of speeding it up.
    """
    wanted = job.limits.max_shards_in_flight
    if wanted != "auto":
        return int(wanted)
    cpus = max(1, int(ray.cluster_resources().get("CPU", 1)))
    mean_task = max(1.0, sum(s.size for task in tasks for s in task) * per_document / max(1, len(tasks)))
    to_fill = math.ceil(sum(s.budget for s in senders) / mean_task)
    return max(1, min(cpus, len(tasks), to_fill + SPARE_TASKS_PER_SENDER * len(senders)))


def _cause(exc: BaseException) -> str:
    """The user-facing error of a shard: the task's own inside a Ray task error, else the last line."""
    inner = getattr(exc, "cause", None)
    if isinstance(inner, BaseException):
        return str(inner)
    lines = str(exc).strip().splitlines()
    return lines[-1] if lines else type(exc).__name__

