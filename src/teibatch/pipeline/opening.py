"""The run's opening: from servers that are up to senders that send, with the servers busy as early as they can be.

The slow steps of an opening are processes starting: the senders' (``pipeline/senders/``) and the
first shard workers' (Ray starts each one, which then imports its modules; docs/client.md has the
times). :class:`Opening` starts them first and meets the servers meanwhile. Its steps, which
``pipeline/run.py`` takes in this order:

0. :class:`EarlyActors`, where Ray is up before the servers are: the senders' and the dedup
   registry's processes start while the id index is read or the fleet comes up, and the first
   workers' while the fleet comes up (:meth:`EarlyActors.warm_workers`);
1. :class:`Opening` (built): the senders' and the first workers' processes start (unless started early);
2. :meth:`Opening.meet`: the servers' ``/info``; the senders' plans are built (once) and given to
   the senders, which connect to their servers; once they have and the first workers have
   started, the probe, which shows the vector size (a server's first batch: from it on, nothing
   waits for a process to start);
3. :meth:`Opening.send`: the senders are told the vector size: the first shard task's chunks go
   as soon as they come;
4. :meth:`Opening.wait_for_workers`: the warmed workers are free again for the first shard tasks;

and, at the end of the run, :meth:`Opening.close` takes the senders' reports and stops them.
Every request of the run is a sender's: the driver sends none itself.
Between 2 and 3 the caller checks that the output takes the servers' vectors: servers it cannot
take get no work beyond the probe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import ray

from teibatch.endpoint import Endpoint
from teibatch.job import JobSpec
from teibatch.pipeline.connect import ConnectedServer, Fleet, ServersMet, connect
from teibatch.pipeline.dedup import Dedup
from teibatch.pipeline.senders.actor import launch_senders, probed_senders, start_senders, stop_senders
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan, plan_senders, split_servers
from teibatch.pipeline.shard import as_shard_work, warm_worker
from teibatch.pipeline.unique_ids import IdIndex
from teibatch.tei import ClientLimits, EmbedOptions

# The longest the run waits for its first workers to start before the first shard task.
WARM_UP_TIMEOUT_S = 60.0


@dataclass
class EarlyActors:
    """The run's actors that need no server to start, started as soon as Ray is up where that is
    before the servers are (while the id index is read, or the fleet comes up): the senders
    (:func:`prelaunch_senders`) and the dedup registry. An actor
    process takes about half a second of CPU to start; started with the first shard task, they
    took it from the task and the senders while the servers waited for their first batches."""

    senders: list[Any] = field(default_factory=list)
    dedup: Dedup | None = None
    workers: list[Any] = field(default_factory=list)  # warm-up tasks (:meth:`warm_workers`)

    @classmethod
    def start(cls, job: JobSpec, *, senders: bool = True, ids: IdIndex | None = None,
              index_coming: bool = False, pending: int | None = None) -> EarlyActors:
        """The actors of ``job``'s run (``senders``: the senders too; else the opening starts them,
        with their servers). The dedup registry by :func:`run_dedup` with the run's id index ``ids``
        and its ``pending`` shards; ``index_coming``: not yet, the index is being read (then
        :meth:`index_read`)."""
        dedup = None if index_coming else run_dedup(job, ids, pending)
        return cls(prelaunch_senders(job) if senders else [], dedup)

    def warm_workers(self, shards: int) -> None:
        """Start the first workers' processes now (:func:`warm_workers`), while the fleet comes up:
        the servers, once up, need not wait for them."""
        self.workers = warm_workers(shards, self.senders)

    def index_read(self, job: JobSpec, ids: IdIndex | None, pending: int | None = None) -> None:
        """The run's id index is read: the dedup registry starts, if the run needs one (:func:`run_dedup`)."""
        self.dedup = run_dedup(job, ids, pending)

    def stop(self) -> None:
        """Stop every actor still here: the senders no opening took, and the dedup registry once the
        run is over (stopping one twice is harmless)."""
        stop_prelaunched(self.senders)
        if self.dedup is not None and self.dedup.registry is not None:
            ray.kill(self.dedup.registry, no_restart=True)


def run_dedup(job: JobSpec, ids: IdIndex | None, pending: int | None = None) -> Dedup | None:
    """``job``'s deduplication: none without ``corpus.deduplicate``; no registry where the run
    embeds one shard (``pending``: how many it embeds, where known) or where the id index ``ids``
    read every text and found none that two shards hold (:meth:`Dedup.within_shards`); else the
    run's registry actor."""
    if not job.corpus.deduplicate:
        return None
    if (pending is not None and pending <= 1) or (ids is not None and ids.texts and not ids.shared):
        return Dedup.within_shards()
    return Dedup.for_run(job.client.request_timeout)


def prelaunch_senders(job: JobSpec) -> list[Any]:
    """Sender actors for the servers ``job`` asks for, started before the servers are known: their
    processes start while the fleet comes up (or the id index is read), and :class:`Opening` gives
    them their servers with their plans. None when the job does not say how many servers it gets
    (``ssh``: one per host of an inventory read later)."""
    expected = _expected_servers(job)
    if expected is None:
        return []
    actors = launch_senders([() for _ in split_servers(range(expected))], job.servers.api_key_env)
    for actor in actors:
        actor.warm.remote()
    return actors


def stop_prelaunched(actors: Sequence[Any]) -> None:
    """Stop sender actors from :func:`prelaunch_senders` that no opening took (stopping one twice is harmless)."""
    for actor in actors:
        ray.kill(actor, no_restart=True)


def _expected_servers(job: JobSpec) -> int | None:
    servers = job.servers
    if servers.provider == "static":
        return len(servers.urls)
    return None if servers.provider == "ssh" else servers.count


class Opening:
    """The opening of one run over ``endpoints`` (see the module's docstring for its steps).

    ``prelaunched``: sender actors from :func:`prelaunch_senders`; used when the fleet came up with
    as many senders' worth of servers as the job asked for, else stopped and others started.
    ``warming``: warm-up tasks from :func:`warm_workers`, started earlier; none: started now.
    """

    def __init__(self, job: JobSpec, options: EmbedOptions, endpoints: Sequence[Endpoint], shards: int,
                 prelaunched: Sequence[Any] = (), warming: Sequence[Any] = ()) -> None:
        self.job, self.options, self.endpoints = job, options, list(endpoints)
        self.started = time.monotonic()
        self.one_machine = on_one_machine()
        groups = split_servers(self.endpoints)
        if len(prelaunched) == len(groups):
            self.actors = list(prelaunched)  # they connect to their servers when their plans come
        else:
            stop_prelaunched(prelaunched)
            self.actors = launch_senders(groups, job.servers.api_key_env)
            for actor in self.actors:
                actor.warm.remote()
        self.workers = list(warming) or warm_workers(shards, self.actors)  # the warm-up tasks of its first workers
        self._unprobed: list[SenderRef] = []
        self.waited = 0.0  # seconds the opening waited for its processes (the senders', the workers')

    def meet(self) -> Fleet:
        """Meet the servers: ``/info``, the senders' plans and the first texts, then the probe."""
        job = self.job
        return connect(self.endpoints, self.options, requested_route=job.client.route, expected_model=job.model.id,
                       api_key_env=job.servers.api_key_env, timeout=job.client.request_timeout,
                       before_probe=self._plan_senders)

    def _plan_senders(self, servers: ServersMet) -> None:
        """Before the servers' first embedding: the senders' plans, built once, given to the senders;
        then the wait for the senders to connect and the first workers to start.

        Waited for here, not after the probe: a server that has answered its first batch would
        otherwise sit idle while those processes start (a second or more on a busy machine), and
        the run's time is the same either way.
        """
        job = self.job
        whole = SenderPlan(tuple(ServerPlan(s.endpoint, server_limits(job, s)) for s in servers.servers),
                           servers.route, self.options, None, servers.model_id, job.servers.api_key_env,
                           job.client.request_timeout, job.client.max_retries)
        self._unprobed, prepared = start_senders(plan_senders(whole), self.actors)
        self._wait_for([*prepared, *self.workers])

    def send(self, fleet: Fleet) -> list[SenderRef]:
        """The senders, told the servers' vector size (the chunks waiting in them go now)."""
        return probed_senders(self._unprobed, fleet.dimension)

    def wait_for_workers(self) -> float:
        """Wait (at most :data:`WARM_UP_TIMEOUT_S`) for the warmed workers; the seconds waited now
        (none where :meth:`meet` already waited for them; :attr:`waited` counts both waits).

        A worker that failed to warm up is found by the first shard task sent to it.
        """
        return self._wait_for(self.workers)

    def _wait_for(self, refs: list[Any]) -> float:
        """Wait (at most :data:`WARM_UP_TIMEOUT_S`) for all of ``refs``; the seconds waited (added to :attr:`waited`).

        A process that failed is found by the first call that needs it (a sender by the first chunk).
        """
        waiting = time.monotonic()
        if refs:
            ray.wait(refs, num_returns=len(refs), timeout=WARM_UP_TIMEOUT_S)
        seconds = time.monotonic() - waiting
        self.waited += seconds
        return seconds

    def close(self) -> dict[str, dict[str, object]]:
        """Per server, what the senders did (their reports); the senders stopped."""
        return stop_senders(self.actors)


def server_limits(job: JobSpec, server: ConnectedServer) -> ClientLimits:
    """What the job allows towards ``server``: its /info limits, lowered by the job's overrides."""
    client = job.client
    return ClientLimits.derive(
        server.info,
        max_batch_size=None if client.max_batch_size == "auto" else client.max_batch_size,
        max_inflight_inputs=None if client.max_inflight_inputs == "auto" else client.max_inflight_inputs,
        max_input_length=None if client.max_input_length == "auto" else client.max_input_length,
        payload_limit=server.endpoint.payload_limit or client.payload_limit)


def warm_workers(shards: int, senders: Sequence[Any] = ()) -> list[Any]:
    """Warm-up tasks (:func:`~teibatch.pipeline.shard.warm_worker`) that start the processes of a run's
    first shard tasks (of ``shards``); their refs, to wait for."""
    warm = as_shard_work(warm_worker)
    return [warm.remote(senders) for _ in range(_workers_to_warm(on_one_machine(), shards))]


def on_one_machine() -> bool:
    """Whether the Ray cluster is one machine (one live node)."""
    return sum(1 for node in ray.nodes() if node.get("Alive")) == 1


def _workers_to_warm(one_machine: bool, shards: int) -> int:
    """One worker on one machine, where the others start later (``pipeline/ramp.py``); else one per core."""
    if one_machine:
        return 1
    return max(1, min(shards, os.cpu_count() or 1, int(ray.cluster_resources().get("CPU", 1))))
