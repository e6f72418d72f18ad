"""The run's opening: from servers that are up to senders that send, with the servers busy as early as they can be.

The slow steps of an opening are processes starting: the senders' (``pipeline/senders/``) and the
first shard workers' (Ray starts each one, which then imports its modules; docs/client.md has the
times). :class:`Opening` starts them first and meets the servers meanwhile. Its steps, which
``pipeline/run.py`` takes in this order:

1. :class:`Opening` (built): the senders' and the first workers' processes start;
2. :meth:`Opening.meet`: the servers' ``/info``; the senders' plans are built (once) and given to
   the senders, which connect to their servers; then the probe, which shows the vector size;
3. :meth:`Opening.send`: the senders are told the vector size: the first shard task's chunks,
   waiting in them, go;
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

import ray

from teibatch.endpoint import Endpoint
from teibatch.job import JobSpec
from teibatch.pipeline.connect import ConnectedServer, Fleet, ServersMet, connect
from teibatch.pipeline.senders.actor import launch_senders, probed_senders, start_senders, stop_senders
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan, plan_senders, split_servers
from teibatch.pipeline.shard import as_shard_work, warm_worker
from teibatch.tei import ClientLimits, EmbedOptions

# The longest the run waits for its first workers to start before the first shard task.
WARM_UP_TIMEOUT_S = 60.0


class Opening:
    """The opening of one run over ``endpoints`` (see the module's docstring for its steps)."""

    def __init__(self, job: JobSpec, options: EmbedOptions, endpoints: Sequence[Endpoint], shards: int) -> None:
        self.job, self.options, self.endpoints = job, options, list(endpoints)
        self.started = time.monotonic()
        self.one_machine = sum(1 for node in ray.nodes() if node.get("Alive")) == 1
        self.actors = launch_senders(split_servers(self.endpoints), job.servers.api_key_env)
        for actor in self.actors:
            actor.warm.remote()
        warm = as_shard_work(warm_worker)
        self._workers = [warm.remote() for _ in range(_workers_to_warm(self.one_machine, shards))]
        self._unprobed: list[SenderRef] = []

    def meet(self) -> Fleet:
        """Meet the servers: ``/info``, the senders' plans and the first texts, then the probe."""
        job = self.job
        return connect(self.endpoints, self.options, requested_route=job.client.route, expected_model=job.model.id,
                       api_key_env=job.servers.api_key_env, timeout=job.client.request_timeout,
                       before_probe=self._plan_senders)

    def _plan_senders(self, servers: ServersMet) -> None:
        """Before the servers' first embedding: the senders' plans, built once, given to the senders."""
        job = self.job
        whole = SenderPlan(tuple(ServerPlan(s.endpoint, server_limits(job, s)) for s in servers.servers),
                           servers.route, self.options, None, servers.model_id, job.servers.api_key_env,
                           job.client.request_timeout, job.client.max_retries)
        self._unprobed = start_senders(plan_senders(whole), self.actors)

    def send(self, fleet: Fleet) -> list[SenderRef]:
        """The senders, told the servers' vector size (the chunks waiting in them go now)."""
        return probed_senders(self._unprobed, fleet.dimension)

    def wait_for_workers(self) -> float:
        """Wait (at most :data:`WARM_UP_TIMEOUT_S`) for the warmed workers; the seconds waited.

        A worker that failed to warm up is found by the first shard task sent to it.
        """
        waiting = time.monotonic()
        ray.wait(self._workers, num_returns=len(self._workers), timeout=WARM_UP_TIMEOUT_S)
        return time.monotonic() - waiting

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


def _workers_to_warm(one_machine: bool, shards: int) -> int:
    """One worker on one machine, where the others start later (``pipeline/ramp.py``); else one per core."""
    if one_machine:
        return 1
    return max(1, min(shards, os.cpu_count() or 1, int(ray.cluster_resources().get("CPU", 1))))
