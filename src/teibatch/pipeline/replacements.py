"""Servers the cloud takes back mid-run (spot capacity): found, taken out, replaced, while the run goes on.

A :class:`ServerWatch` runs beside the shard scheduler for a provider that can replace servers
(:class:`~teibatch.fleet.base.ReplacesLost`: RunPod, Vast). Every ``watch_interval()`` seconds it asks
the provider which servers the cloud took back; for each one:

1. the sender that owns it takes it out for good (``EndpointPool.lose``): its requests in flight are
   called back at once and their texts sent to the other servers. Nothing is lost (every text still
   ends with a vector or a failure that leaves its shard uncommitted) and nothing is written twice
   (a shard is committed once, from its task's vectors). With no server left the sender waits for
   the replacement instead of giving up;
2. the provider gives the instance back and rents a replacement (bounded by
   ``servers.max_replacements``; the ledger records both, and the lost one's rented time ends);
3. the replacement is met like the run's first servers (``/info``, a probe with the job's options)
   and must serve the run's model and vector size; then it joins the same sender.

Each step is a run event (``server_lost``, ``server_replaced``, ``server_not_replaced``) and the
report lists what happened (``replacements``). The watch never stops the run: what it cannot do is
said, and the run goes on with the servers it has.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import ray

from teibatch.endpoint import Endpoint
from teibatch.errors import FleetError, TeibatchError
from teibatch.fleet import LostServer, Provider, ReplacesLost
from teibatch.pipeline.progress import Reporter
from teibatch.pipeline.senders.plans import SenderRef, ServerPlan
from teibatch.pipeline.summary import RunSummary

log = logging.getLogger(__name__)

# How long the watch waits for a sender to take a server in or out, and for itself to stop.
SENDER_CALL_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 10.0

Meet = Callable[[list[Endpoint]], list["ServerPlan | str"]]


class ServerWatch:
    """Watches ``provider`` for servers the cloud takes back and puts replacements in their place.

    ``meet`` turns the replacements' endpoints into server plans (each met and checked against the
    run's model and vector size), or into the reason one cannot serve the run. Used as a context
    manager around the run's shard scheduling.
    """

    def __init__(self, provider: Provider, senders: Sequence[SenderRef], meet: Meet, reporter: Reporter,
                 summary: RunSummary) -> None:
        assert isinstance(provider, ReplacesLost)
        self.provider = provider
        self.name = provider.name
        self.meet = meet
        self.reporter = reporter
        self.summary = summary
        self._actors = [s.actor for s in senders]
        self._plans = [s.plan for s in senders]
        self._owner = {p.endpoint.url: i for i, s in enumerate(senders) for p in s.plan.servers}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="teibatch-server-watch", daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self._stop.set()
        # A replacement being rented stops when the provider is torn down, right after this.
        self._thread.join(STOP_TIMEOUT_S)

    def _watch(self) -> None:
        while not self._stop.wait(self.provider.watch_interval()):
            try:
                self.check()
            except Exception:  # the watch must never end the run; say what went wrong and go on watching
                log.exception("looking for servers taken back by %s failed", self.name)

    def check(self) -> int:
        """One look: take out and replace what the cloud took back since the last one; how many it took."""
        try:
            lost = self.provider.lost()
        except FleetError as exc:
            log.warning("could not ask %s whether it took a server back (asking again in %.0fs): %s", self.name,
                        self.provider.watch_interval(), exc)
            return 0
        if not lost:
            return 0
        entries = [self._take_out(server) for server in lost]
        started = time.monotonic()
        try:
            endpoints = [] if self._stop.is_set() else self.provider.replace(lost)
            met = self.meet(endpoints) if endpoints and not self._stop.is_set() else []
        except Exception as exc:  # whatever went wrong, the senders must stop waiting for a replacement
            log.exception("renting a replacement on %s failed", self.name)
            met = [f"renting a replacement failed: {exc}"]
        ready = [plan for plan in met if isinstance(plan, ServerPlan)]
        refused = [reason for reason in met if isinstance(reason, str)]
        for server, entry in zip(lost, entries, strict=True):
            owner = self._owner.get(server.url)
            if ready and not self._stop.is_set():
                self._put_in(owner, ready.pop(0), server, entry, time.monotonic() - started)
                continue
            why = "; ".join(refused) or ("the run is ending" if self._stop.is_set() else
                                         "no replacement: servers.max_replacements used up or no capacity "
                                         "(see the log)")
            entry.update(status="not replaced", why=why)
            if owner is not None:
                self._call(self._actors[owner].not_coming.remote(self._plans[owner]))
            self.reporter.message(f"{server.name} was not replaced ({why}); the run goes on with the other servers",
                                  event="server_not_replaced", instance=server.name)
        return len(lost)

    def _take_out(self, server: LostServer) -> dict[str, Any]:
        owner = self._owner.get(server.url)
        if owner is not None:
            self._call(self._actors[owner].lose.remote(server.url, True, self._plans[owner]))
        self.reporter.message(f"{server.name} ({server.url}) was taken back by {self.name} ({server.reason}): its "
                              "requests went to the other servers; renting a replacement", event="server_lost",
                              instance=server.name, reason=server.reason)
        entry: dict[str, Any] = {"instance": server.name, "url": server.url, "reason": server.reason,
                                 "status": "replacing"}
        self.summary.replacements.append(entry)
        return entry

    def _put_in(self, owner: int | None, plan: ServerPlan, server: LostServer, entry: dict[str, Any],
                seconds: float) -> None:
        owner = 0 if owner is None else owner
        self._plans[owner] = sender_plan = self._plans[owner].with_server(plan)
        self._owner[plan.endpoint.url] = owner
        self._call(self._actors[owner].add.remote(plan, sender_plan))
        entry.update(status="replaced", replacement_url=plan.endpoint.url, seconds_to_replace=round(seconds, 1))
        self.reporter.message(f"{server.name} replaced by the server at {plan.endpoint.url} after {seconds:.0f}s",
                              event="server_replaced", instance=server.name, replacement=plan.endpoint.url)

    @staticmethod
    def _call(ref: Any) -> None:
        """Wait for one call to a sender; a sender that died is restarted by Ray and meets its servers again."""
        try:
            ray.get(ref, timeout=SENDER_CALL_TIMEOUT_S)
        except (ray.exceptions.RayError, TimeoutError) as exc:
            log.warning("a sender did not take the change of servers: %s", exc)


def meet_replacements(connect: Callable[[list[Endpoint]], Any], limits: Callable[[Any], Any], model_id: str,
                      dimension: int) -> Meet:
    """How a run meets its replacements: ``connect`` (the run's own way of meeting servers) on each one
    alone, its model and vector size compared with the run's, then its limits as the job allows them."""

    def meet(endpoints: list[Endpoint]) -> list[ServerPlan | str]:
        met: list[ServerPlan | str] = []
        for endpoint in endpoints:
            try:
                fleet = connect([endpoint])
            except TeibatchError as exc:
                met.append(f"{endpoint.url}: {exc}")
                continue
            if fleet.model_id != model_id or fleet.dimension != dimension:
                met.append(f"{endpoint.url} serves {fleet.dimension}-dimension vectors of {fleet.model_id}, the run "
                           f"{dimension}-dimension vectors of {model_id}")
                continue
            met.append(ServerPlan(endpoint, limits(fleet.servers[0])))
        return met

    return meet
