"""The run's opening: from servers that are up to senders that send, with the servers busy as early as they can be.

The slow steps of an opening are processes starting: the senders' (``pipeline/senders/``) and the
first shard workers' (Ray starts each one, which then imports its modules; docs/client.md has the
times). :class:`Opening` starts them first and meets the servers meanwhile. Its steps, which
``pipeline/run.py`` takes in this order:

1. :class:`Opening` (built): the senders' and the first workers' processes start, and the head
   start's first texts are read (``pipeline/head_start.py``);
2. :meth:`Opening.meet`: the servers' ``/info``; the senders' plans are built (once) and the
   driver's own requests of the first texts planned with them (``pipeline/head_start_requests.py``: the
   plans say what the driver holds of each server's budget); the senders get the first texts,
   which wait in them; then the probe, which shows the vector size;
3. :meth:`Opening.send`: the driver's requests go, and the senders are told the vector size; the
   driver keeps the servers busy until the senders run; the head start is read on to the senders'
   whole budget, for the first shard task;
4. :meth:`Opening.wait_for_workers`: the warmed workers are free again for the first shard tasks;

and, at the end of the run, :meth:`Opening.close` takes the senders' reports and stops them.
Between 2 and 3 the caller checks that the output takes the servers' vectors: servers it cannot
take get no work beyond the probe.
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import ray

from teibatch.corpus import Shard
from teibatch.endpoint import Endpoint
from teibatch.job import JobSpec
from teibatch.pipeline.connect import ConnectedServer, Fleet, ServersMet, connect
from teibatch.pipeline.head_start import MIN_HEAD_START_TEXTS, HeadStart, HeadStartTexts, send_head_start
from teibatch.pipeline.head_start_requests import HeadStartRequests, plan_head_start_requests
from teibatch.pipeline.senders.actor import launch_senders, probed_senders, start_senders, stop_senders
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan, plan_senders, split_servers
from teibatch.pipeline.shard import as_shard_work, warm_worker
from teibatch.tei import ClientLimits, EmbedOptions, EmbedResult
from teibatch.tei.pool import ServerStats

# The longest the run waits for its first workers to start before the first shard task.
WARM_UP_TIMEOUT_S = 60.0


class Opening:
    """The opening of one run over ``endpoints`` (see the module's docstring for its steps).

    ``head_start``: the shard whose first texts the driver sends itself, or ``None`` for no head start.
    """

    def __init__(self, job: JobSpec, options: EmbedOptions, endpoints: Sequence[Endpoint], shards: int,
                 head_start: Shard | None) -> None:
        self.job, self.options, self.endpoints = job, options, list(endpoints)
        self.started = time.monotonic()
        self.one_machine = sum(1 for node in ray.nodes() if node.get("Alive")) == 1
        self.actors = launch_senders(split_servers(self.endpoints), job.servers.api_key_env)
        for actor in self.actors:
            actor.warm.remote()
        warm = as_shard_work(warm_worker)
        self._workers = [warm.remote() for _ in range(_workers_to_warm(self.one_machine, shards))]
        self._unprobed: list[SenderRef] = []
        self._owners: dict[str, Any] = {}  # the sender actor of each server URL
        self.requests: HeadStartRequests | None = None
        self.head: HeadStartTexts | None = None
        if head_start is not None:
            self.head = HeadStartTexts(job.corpus_options(), head_start, distinct=job.corpus.deduplicate)
            self.head.read(MIN_HEAD_START_TEXTS)

    def meet(self) -> Fleet:
        """Meet the servers: ``/info``, the senders' plans and the first texts, then the probe."""
        job = self.job
        return connect(self.endpoints, self.options, requested_route=job.client.route, expected_model=job.model.id,
                       api_key_env=job.servers.api_key_env, timeout=job.client.request_timeout,
                       before_probe=self._plan_senders)

    def _plan_senders(self, servers: ServersMet) -> None:
        """Before the servers' first embedding: the senders' plans, built once (and the driver's
        requests, planned with them: the plans say what the driver holds), and the first texts."""
        job = self.job
        whole = SenderPlan(tuple(ServerPlan(s.endpoint, server_limits(job, s)) for s in servers.servers),
                           servers.route, self.options, None, servers.model_id, job.servers.api_key_env,
                           job.client.request_timeout, job.client.max_retries)
        plans, head, requests = plan_senders(whole), self.head, None
        if head is not None:
            chunk_size = min(plan.chunk_size for plan in plans)
            head.read_chunks(MIN_HEAD_START_TEXTS, chunk_size)
            requests = plan_head_start_requests(whole, head.texts, chunk_size) if not head.failed else None
        if requests is not None:  # it connects now, and sends once :meth:`send` gives it the vector size
            requests.start(whole, landed=self._landed, released=self._released, deposit=self._deposit)
            plans = [plan.holding(requests.held) for plan in plans]
        self.requests = requests
        self._unprobed = start_senders(plans, self.actors)
        self._owners = {p.endpoint.url: sender.actor for sender in self._unprobed for p in sender.plan.servers}
        if head is not None:
            head.send(self._unprobed, MIN_HEAD_START_TEXTS, requests.keys if requests is not None else ())

    def send(self, fleet: Fleet) -> tuple[list[SenderRef], HeadStart | None]:
        """The servers' vector size, told to the driver's requests and the senders (the texts waiting in them go
        now); the senders, and the whole head start."""
        senders = probed_senders(self._unprobed, fleet.dimension)
        if self.requests is not None:
            running = [sender.actor.running.remote().future() for sender in senders]
            self.requests.go(fleet.dimension, lambda: all(future.done() for future in running))  # no call to Ray
        head = send_head_start(self.head, senders) if self.head is not None else None
        return senders, head

    # What the driver's requests tell the senders (called from their thread, see ``pipeline/head_start_requests.py``).

    def _landed(self, url: str, stats: ServerStats) -> None:
        self._owners[url].others_landed.remote(url, stats)

    def _released(self, url: str, inputs: int) -> None:
        self._owners[url].others_released.remote(url, inputs)

    def _deposit(self, key: int, result: EmbedResult) -> None:
        if self.head is not None:
            self._unprobed[self.head.sender_of(key)].actor.deposit.remote(key, result)

    def sent_texts(self) -> list[str]:
        """The head start's texts sent so far (the first shard's first texts), in order."""
        return self.head.sent_texts() if self.head is not None else []

    def wait_for_workers(self) -> float:
        """Wait (at most :data:`WARM_UP_TIMEOUT_S`) for the warmed workers; the seconds waited.

        A worker that failed to warm up is found by the first shard task sent to it.
        """
        waiting = time.monotonic()
        ray.wait(self._workers, num_returns=len(self._workers), timeout=WARM_UP_TIMEOUT_S)
        return time.monotonic() - waiting

    def close(self) -> dict[str, dict[str, object]]:
        """Per server, what the senders did (their reports); the driver's requests and the senders stopped."""
        if self.requests is not None:
            self.requests.stop()
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


def _workers_to_warm(one_machine: bool, shards: int) -> int:
    """One worker on one machine, where the others start later (``pipeline/ramp.py``); else one per core."""
    if one_machine:
        return 1
    return max(1, min(shards, os.cpu_count() or 1, int(ray.cluster_resources().get("CPU", 1))))
