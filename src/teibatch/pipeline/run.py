"""The driver: plan → fleet up → shards on Ray → commit → report → fleet down."""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress

import ray

from teibatch.corpus import Shard, keep_field_types, plan_shards
from teibatch.crashpoints import crashpoint, task_environment
from teibatch.errors import (
    CapacityUnavailable,
    RunIncomplete,
    SinkError,
    TeiAuthError,
    TeibatchError,
    WrongModelKind,
)
from teibatch.fleet import Provider
from teibatch.job import JobSpec
from teibatch.pipeline.connect import ConnectedServer, Fleet, connect
from teibatch.pipeline.context import ServerPlan, ShardContext
from teibatch.pipeline.progress import Reporter, SilentReporter
from teibatch.pipeline.providers import fleet_session, provider_for
from teibatch.pipeline.shard import ShardOutcome, process_shard
from teibatch.pipeline.summary import RunSummary, new_run_id
from teibatch.sink import (
    Manifest,
    OutputStore,
    VectorSchema,
    WriteOptions,
    remove_stale,
    remove_uncommitted_temp,
)
from teibatch.sink import write_report as save_report
from teibatch.tei import ClientLimits, EmbedOptions

log = logging.getLogger(__name__)

# Errors that would fail every other shard the same way: stop the run at once.
FATAL_ERRORS = (TeiAuthError, WrongModelKind, CapacityUnavailable)


def run_job(job: JobSpec, *, ray_address: str | None = None, reporter: Reporter | None = None) -> RunSummary:
    """Run ``job`` to completion; raise :class:`RunIncomplete` (after writing the report) if shards remain."""
    reporter = reporter or SilentReporter()
    summary = RunSummary(run_id=new_run_id())
    started = time.monotonic()
    store = OutputStore(job.output.path, job.output.storage_options)
    manifest = _open_manifest(store, job)
    provider = provider_for(job)  # checks the servers section (API key variable set) before any work
    shards = plan_shards(job.corpus_options())
    live = {s.id for s in shards}
    pending = [s for s in shards if s.id not in manifest.shards]
    manifest.planned = [s.id for s in shards]
    summary.shards_total, summary.shards_skipped = len(shards), len(shards) - len(pending)
    summary.timings["plan_s"] = time.monotonic() - started
    crashpoint("plan")
    remove_uncommitted_temp(store)
    manifest.runs.append(summary.run_id)
    if summary.shards_skipped:
        reporter.message(f"resuming: {summary.shards_skipped} of {len(shards)} shards already committed")
    try:
        with _terminate_as_interrupt():
            if pending:
                previous = _previous_parts(job, manifest, live)
                _embed_pending(job, provider, pending, previous, manifest, store, summary, reporter, ray_address)
        summary.status = "done" if not summary.shards_failed else "incomplete"
    except (KeyboardInterrupt, SystemExit):
        # SystemExit: a SIGTERM that came while ray.init's own handler (which exits) was in place.
        summary.status = "interrupted"
        summary.errors.append("interrupted (Ctrl-C or SIGTERM)")
    except TeibatchError as exc:
        summary.status = "failed"
        summary.errors.append(str(exc))
        raise
    finally:
        reporter.stop()
        if summary.status == "done":
            remove_stale(store, manifest, live)
        manifest.save(store)
        summary.timings["total_s"] = time.monotonic() - started
        save_report(store, summary.run_id, summary.to_json())
    if summary.status != "done":
        missing = len(shards) - len(manifest.shards.keys() & live)
        first = f" (first error: {summary.errors[0]})" if summary.errors else ""
        raise RunIncomplete(f"{summary.status}: {missing} of {len(shards)} shards are not committed{first}; "
                            "run the same command again to finish them")
    return summary


def _open_manifest(store: OutputStore, job: JobSpec) -> Manifest:
    manifest = Manifest.load(store)
    fingerprint = job.output_fingerprint()
    if manifest is None:
        return Manifest(fingerprint=fingerprint, job_name=job.name)
    if manifest.fingerprint != fingerprint:
        raise SinkError(
            f"{store.url} holds vectors made with other model options or reading options (job "
            f"{manifest.job_name!r}); mixing them would give inconsistent vectors. Write to a new "
            "output.path, or delete the old output first")
    return manifest


def _previous_parts(job: JobSpec, manifest: Manifest, live: set[str]) -> Callable[[Shard], tuple[str, ...]]:
    """Incremental mode: where an earlier run wrote the documents of a shard that changed."""
    stale = Manifest(manifest.fingerprint, manifest.job_name,
                     shards={sid: e for sid, e in manifest.shards.items() if sid not in live})

    def previous(shard: Shard) -> tuple[str, ...]:
        return tuple(stale.parts_reading(shard.sources)) if job.mode == "incremental" else ()

    return previous


def _embed_pending(job: JobSpec, provider: Provider, pending: list[Shard],
                   previous: Callable[[Shard], tuple[str, ...]], manifest: Manifest, store: OutputStore,
                   summary: RunSummary, reporter: Reporter, ray_address: str | None) -> None:
    options = EmbedOptions(normalize=job.model.normalize, truncate=job.model.truncate,
                           truncation_direction=job.model.truncation_direction,
                           prompt_name=job.model.prompt_name, dimensions=job.model.dimensions,
                           on_too_long=job.model.on_too_long)
    clock = time.monotonic()
    with fleet_session(job, provider, summary.run_id) as endpoints:
        reporter.message(f"{len(endpoints)} {provider.name} server(s) ready")
        fleet = connect(endpoints, options, requested_route=job.client.route, expected_model=job.model.id,
                        api_key_env=job.servers.api_key_env, timeout=job.client.request_timeout)
        summary.timings["fleet_up_s"] = time.monotonic() - clock
        manifest.info = {"model_id": fleet.model_id, "dimension": fleet.dimension, "route": fleet.route,
                         "servers": [s.info.to_json() for s in fleet.servers]}
        with _ray_session(ray_address):
            in_flight = _shards_in_flight(job, fleet)
            context = _context(job, fleet, options, in_flight)
            clock = time.monotonic()
            reporter.start(len(pending), sum(s.size for s in pending))
            _schedule(pending, previous, context, in_flight, manifest, store, summary, reporter, job)
            summary.timings["embed_s"] = time.monotonic() - clock


def _context(job: JobSpec, fleet: Fleet, options: EmbedOptions, in_flight: int) -> ShardContext:
    plans = []
    for server in fleet.servers:
        limits = _limits(job, server)
        # The server counts inputs from all shard tasks together: each task gets its share.
        plans.append(ServerPlan(server.endpoint, limits.share(in_flight)))
    corpus = job.corpus_options()
    hash_options = {**job.vector_options(), "model": fleet.model_id}
    schema = VectorSchema(dimension=fleet.dimension, vector_type=job.output.vector_type,
                          kept=keep_field_types(corpus),
                          metadata={"model_id": fleet.model_id, "options": hash_options, "job": job.name})
    return ShardContext(corpus=corpus, servers=tuple(plans), route=fleet.route, embed=options,
                        hash_options=hash_options, schema=schema,
                        write=WriteOptions(job.output.compression, job.output.row_group_size),
                        output=job.output.path, output_options=dict(job.output.storage_options),
                        max_retries=job.client.max_retries, request_timeout=job.client.request_timeout,
                        model_id=fleet.model_id, api_key_env=job.servers.api_key_env)


def _limits(job: JobSpec, server: ConnectedServer) -> ClientLimits:
    """What the job allows towards ``server``: its /info limits, lowered by the job's overrides."""
    client = job.client
    return ClientLimits.derive(
        server.info,
        max_batch_size=None if client.max_batch_size == "auto" else client.max_batch_size,
        max_inflight_inputs=None if client.max_inflight_inputs == "auto" else client.max_inflight_inputs,
        max_input_length=None if client.max_input_length == "auto" else client.max_input_length,
        payload_limit=server.endpoint.payload_limit or client.payload_limit)


def _shards_in_flight(job: JobSpec, fleet: Fleet) -> int:
    """Shard tasks at once: the job's number or the cluster's CPUs, and never more than every server can
    give one input in flight to (each task holds a share of every server's in-flight limit)."""
    wanted = job.limits.max_shards_in_flight
    count = int(wanted) if wanted != "auto" else max(1, int(ray.cluster_resources().get("CPU", 1)))
    return min(count, *(_limits(job, server).max_parts for server in fleet.servers))


def _shard_task(shard: Shard, context: ShardContext, previous: tuple[str, ...]) -> ShardOutcome:
    outcome = process_shard(shard, context, previous)
    return dataclasses.replace(outcome, node=ray.get_runtime_context().get_node_id())


def _schedule(pending: list[Shard], previous: Callable[[Shard], tuple[str, ...]], context: ShardContext,
              in_flight: int, manifest: Manifest, store: OutputStore, summary: RunSummary, reporter: Reporter,
              job: JobSpec) -> None:
    """Keep ``in_flight`` shard tasks running; commit each one as it finishes."""
    # Ray retries a task whose worker died (max_retries); an exception raised by the task is final.
    task = ray.remote(num_cpus=1, max_retries=3, retry_exceptions=False)(_shard_task)
    if crash_settings := task_environment():
        task = task.options(runtime_env={"env_vars": crash_settings})
    context_ref = ray.put(context)
    queue = list(reversed(pending))
    running_refs: dict[ray.ObjectRef, Shard] = {}
    deadline = time.monotonic() + job.limits.max_runtime if job.limits.max_runtime else None
    try:
        while queue or running_refs:
            while queue and len(running_refs) < in_flight:
                shard = queue.pop()
                running_refs[task.remote(shard, context_ref, previous(shard))] = shard
            timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, _ = ray.wait(list(running_refs), num_returns=1, timeout=timeout)
            if not done:
                summary.errors.append(f"limits.max_runtime ({job.limits.max_runtime:.0f}s) reached")
                summary.shards_failed += len(running_refs) + len(queue)
                return
            for ref in done:
                shard = running_refs.pop(ref)
                try:
                    outcome: ShardOutcome = ray.get(ref)
                except Exception as exc:
                    cause = getattr(exc, "cause", None)
                    if isinstance(cause, FATAL_ERRORS):
                        raise cause from None
                    summary.shards_failed += 1
                    summary.errors.append(f"shard {shard.id}: {_cause(exc)}")
                    reporter.message(f"shard {shard.id} failed: {_cause(exc)}")
                    reporter.advance(1, shard.size)
                    continue
                manifest.commit(shard.id, outcome.rows, outcome.rejects, summary.run_id, shard.sources)
                manifest.save(store)
                crashpoint("commit")
                summary.add(outcome)
                reporter.advance(1, shard.size)
    finally:
        for ref in running_refs:
            ray.cancel(ref, force=True)


def _cause(exc: BaseException) -> str:
    """The user-facing error inside a Ray task error."""
    inner = getattr(exc, "cause", None)
    return str(inner) if isinstance(inner, BaseException) else str(exc).strip().splitlines()[-1]


@contextmanager
def _ray_session(address: str | None) -> Iterator[None]:
    """Use the running Ray (``ray job submit``), the given cluster, or start a local one for this run."""
    if ray.is_initialized():
        yield
        return
    address = address or os.environ.get("RAY_ADDRESS") or None
    ray.init(address=address, include_dashboard=False, log_to_driver=False,
             logging_level=logging.WARNING, configure_logging=False)
    # ray.init put its own SIGTERM handler (it aborts the driver): SIGTERM must still reach the fleet teardown.
    with suppress(ValueError):  # ValueError: not the main thread
        signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        yield
    finally:
        ray.shutdown()


@contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """Treat SIGTERM like Ctrl-C so that every ``finally`` (fleet teardown above all) runs."""
    try:
        previous = signal.signal(signal.SIGTERM, signal.default_int_handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
