"""Renting cloud instances for one run, so that nothing rented is ever forgotten.

What providers ``lambda``, ``runpod`` and ``vast`` share. Every server of a run has a ledger entry
``teibatch-<run id>-<n>``, written **before** any create call for it; each create call (one per offer
tried) names its instance uniquely: ``teibatch-<run id>-<n>`` for the first offer, ``…-<n>.<k>`` for the
k-th next one. The run's label is the prefix ``teibatch-<run id>-`` that every name carries, so:

* a create call that times out, or that the cloud answers with a 5xx, is followed by a look-up of its
  own name: an instance that was made is adopted, else the next offer is tried under the next name
  (an instance of the first name that shows up later is not mistaken for the second);
* teardown (:meth:`Rental.terminate_all`) and ``teibatch fleet sweep`` terminate **every** instance the
  cloud lists with the run's label, by its id, not only the ids the run remembers: also those whose
  create call never answered, and those that became visible only after it timed out (teardown waits
  up to :data:`LATE_LISTING_S` for a create that never answered to show up);
* an offer that has no capacity (or is gone) moves on to the next offer;
* every wait has a deadline; a terminate that finds nothing counts as done, one answered with a
  429/5xx or not answered in time is sent again until its deadline (sending it again is harmless), and
  so are the status polls after it and the listing of the run's instances at teardown;
* an instance that served and that the cloud then stops, or no longer lists, was taken back
  (:meth:`Rental.taken_back`: a spot instance preempted); renting more later goes on with the
  next name, and :attr:`Rental.closing` ends any wait at once (the run is tearing down).

The cloud-specific part is a :class:`CloudApi`: a small client over the cloud's own API.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Collection, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from teibatch.errors import (
    CapacityUnavailable,
    CloudApiError,
    FleetError,
    FleetTimeout,
    RateLimited,
    TeardownIncomplete,
)
from teibatch.fleet.base import InstanceState
from teibatch.fleet.catalog import BillingRule
from teibatch.fleet.hosted import container_name
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import Offer

log = logging.getLogger(__name__)

POLL_S = 2.0
WATCH_S = 10.0   # how often a run asks the cloud whether it took any serving instance back
TERMINATE_TIMEOUT_S = 120.0
SERVE_THREADS = 16        # instances served at once (their boot, image pull and model download overlap)
LATE_LISTING_S = 60.0   # how long teardown looks for the instance of a create call that never answered
NAME_PREFIX = "teibatch-"


def attempt_name(name: str, attempt: int) -> str:
    """The cloud-side name of create call ``attempt`` (0, 1, ...) for server ``name``: unique per attempt."""
    return name if attempt == 0 else f"{name}.{attempt}"


def transient(exc: FleetError) -> bool:
    """Whether a failed API call may succeed when sent again: no answer in time, a 429 or a 5xx."""
    return isinstance(exc, FleetTimeout) or (isinstance(exc, CloudApiError) and exc.retryable)


def slot_of(cloud_name: str) -> str:
    """The server (ledger entry) a cloud-side name belongs to: ``teibatch-r-0.2`` → ``teibatch-r-0``."""
    base, dot, attempt = cloud_name.rpartition(".")
    return base if dot and attempt.isdigit() else cloud_name


class CloudState(str, Enum):
    """Where a cloud instance stands, mapped from the cloud's own status words."""

    PENDING = "pending"    # being made or booting
    READY = "ready"        # running and reachable (an address, its port mapped)
    FAILED = "failed"      # the cloud says it is broken; still to be terminated
    GONE = "gone"          # terminated or terminating: costs nothing any more
    UNKNOWN = "unknown"    # a status word not known here: treated as still running


@dataclass(frozen=True)
class CloudInstance:
    """One instance as the cloud's API last showed it; holds no secret."""

    id: str
    name: str
    state: CloudState
    status: str = ""                               # the cloud's own word, for messages
    address: str | None = None                     # public IP
    ports: Mapping[int, int] = field(default_factory=dict)   # private port → public port
    price_per_hour: float | None = None


class CloudApi(ABC):
    """The calls a rental needs from a cloud; each cloud module implements it over its own API."""

    name: str
    billing: BillingRule

    @abstractmethod
    def offers(self) -> list[Offer]:
        """Every card the cloud would rent now, with its current price (one offer per region where it matters)."""

    @abstractmethod
    def get(self, instance_id: str) -> CloudInstance | None:
        """The instance, or ``None`` when the cloud no longer knows it."""

    @abstractmethod
    def list(self, prefix: str) -> list[CloudInstance]:
        """The account's instances whose name starts with ``prefix``, terminated ones left out."""

    @abstractmethod
    def terminate(self, instance_id: str) -> None:
        """Give the instance back; an instance the cloud no longer knows counts as terminated."""

    @abstractmethod
    def close(self) -> None:
        """Release the HTTP client."""


@dataclass
class Rented:
    """A server of this run: its name (the ledger entry's, always), the cloud-side name of its current create
    attempt, its cloud id (once known), the offer it came from."""

    name: str
    offer: Offer | None = None
    cloud_name: str = ""                           # "" until a create call is sent: then the attempt's name
    id: str | None = None
    seen: CloudInstance | None = None
    terminated: bool = False
    error: str | None = None
    started: float = field(default_factory=time.monotonic)


class Rental:
    """The instances one run rents from one cloud, each recorded in the ledger before it is asked for."""

    def __init__(self, api: CloudApi, ledger: Ledger, run_id: str) -> None:
        self.api = api
        self.ledger = ledger
        self.run_id = run_id
        self.rented: dict[str, Rented] = {}
        self.never_served = 0                 # instances given back because they never served, in all
        self.closing = threading.Event()     # set by teardown: waits end, nothing more is rented
        self._next = 0                        # the number in the next instance's name
        self.unanswered: set[str] = set()     # cloud names of create calls that never answered, none found yet
        self._pool: ThreadPoolExecutor | None = None

    @classmethod
    def from_record(cls, api: CloudApi, ledger: Ledger, record: Mapping[str, Any]) -> Rental:
        """The rental of a recorded run (for ``teibatch fleet sweep``): its instances as the ledger last shows them.

        A create call the ledger shows sent and never answered (the driver was killed while it was in flight,
        or before it wrote the answer down) counts as :attr:`unanswered`: teardown waits for its instance
        to be listed, as the cloud may list it late."""
        rental = cls(api, ledger, str(record["run_id"]))
        for name, entry in record.get("instances", {}).items():
            state = entry.get("state")
            rental.rented[name] = Rented(name, id=entry.get("cloud_id"), cloud_name=entry.get("cloud_name", name),
                                         terminated=state == InstanceState.DESTROYED.value)
            rental.unanswered.update(entry.get("unanswered", ()))
            if (entry.get("create_sent") and entry.get("cloud_name") and not entry.get("cloud_id")
                    and state not in (InstanceState.DESTROYED.value, InstanceState.FAILED.value)):
                rental.unanswered.add(str(entry["cloud_name"]))
        return rental

    @property
    def prefix(self) -> str:
        return f"{NAME_PREFIX}{self.run_id}-"

    def note(self, name: str, state: InstanceState | None, **fields: Any) -> None:
        self.ledger.update(self.run_id, name, state, **fields)

    def rent(self, name: str, offers: tuple[Offer, ...], create: Callable[[str, Offer], str]) -> Rented | None:
        """Create ``name`` from the first offer that has capacity; ``None`` when none had (``error`` says why).

        The ledger holds the name before each create call; each call names its instance uniquely
        (:func:`attempt_name`); a create call that timed out or got a 5xx is followed by a look-up of that
        name, and an instance found is adopted.
        """
        item = self.rented.setdefault(name, Rented(name))
        self.note(name, InstanceState.REQUESTED, cloud=self.api.name, host=None)  # raises: nothing is created
        reasons = []
        for attempt, offer in enumerate(offers):
            cloud_name = attempt_name(name, attempt)
            self.note(name, None, offer=offer.label, gpu=offer.gpu, price_per_hour=offer.price_per_hour,
                      create_sent=True, cloud_name=cloud_name)
            item.offer, item.started, item.cloud_name = offer, time.monotonic(), cloud_name
            try:
                item.id = create(cloud_name, offer)
            except CapacityUnavailable as exc:
                reasons.append(f"{offer.label}: {exc}")
                log.info("%s: %s; trying the next offer", name, exc)
                continue
            except RateLimited as exc:  # the cloud did not process the call: no offer is "full" because of it
                found = self.find(cloud_name)
                if found is None:
                    reasons.append(str(exc))
                    break
                item.id = found.id
            except (FleetTimeout, CloudApiError) as exc:
                if isinstance(exc, CloudApiError) and not exc.retryable:
                    raise
                found = self.find(cloud_name)
                if found is None:
                    reasons.append(f"{offer.label}: {exc}")
                    self.unanswered.add(cloud_name)
                    self.note(name, None, unanswered=sorted(n for n in self.unanswered if slot_of(n) == name))
                    log.warning("%s: %s and no instance of that name exists (yet); trying the next offer; "
                                "teardown looks for it again by the run's label", cloud_name, exc)
                    continue
                item.id = found.id
                log.warning("%s: the create call failed (%s) but the instance was made: adopted", cloud_name, exc)
            self.note(name, None, cloud_id=item.id)
            return item
        item.error = "; ".join(reasons) or "no offer"
        self.note(name, InstanceState.FAILED, error=item.error)
        return None

    def fill(self, count: int, offers: tuple[Offer, ...], create: Callable[[str, Offer], str],
             serve: Callable[[Rented], bool], *, startup_timeout: float, max_replacements: int,
             noun: str = "instance") -> list[str]:
        """Rent until ``count`` instances serve: each batch is created (paced by the cloud's client, not one
        startup after another), waited for, then ``serve``d all at once, one thread each, so that ``count``
        servers start in about the time of one plus the pacing.

        An instance that never serves (``serve`` gave it back) is replaced, at most ``max_replacements``
        times in this call; no capacity on any offer stops renting, and so does :attr:`closing`. Names
        go on from the last instance rented (``teibatch-<run id>-<n>``). Returns why fewer than ``count`` serve.
        """
        healthy, failures, reasons = 0, 0, list[str]()
        while healthy < count and not self.closing.is_set():
            batch = []
            for _ in range(count - healthy):
                name = container_name(self.run_id, self._next)
                self._next += 1
                item = self.rent(name, offers, create)
                if item is None:
                    reasons.append(f"no capacity: {self.rented[name].error}")
                    break
                batch.append(item)
            if not batch:
                break
            # each instance has startup_timeout from its own create call
            self.wait_ready(batch, max(item.started for item in batch) + startup_timeout)
            served = list(self._serving().map(serve, batch))
            for item, ok in zip(batch, served, strict=True):
                if ok:
                    healthy += 1
                else:
                    failures += 1
                    self.never_served += 1
                    reasons.append(f"{item.name}: {item.error}")
            if healthy < count and failures > max_replacements:
                reasons.append(f"{failures} {noun}(s) never became healthy (servers.max_replacements: "
                               f"{max_replacements})")
                break
        return reasons

    def _serving(self) -> ThreadPoolExecutor:
        """The threads that serve instances, kept until teardown: what a serve starts (an SSH tunnel) is tied
        to its thread (it dies with it), so the threads outlive the serve calls."""
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=SERVE_THREADS, thread_name_prefix="serve")
        return self._pool

    def find(self, name: str) -> CloudInstance | None:
        """The live instance named ``name``, looked up by name (``None``: there is none, or the API failed)."""
        try:
            return next((i for i in self.api.list(name) if i.name == name and i.state is not CloudState.GONE), None)
        except FleetError as exc:
            log.warning("%s: could not list instances: %s", name, exc)
            return None

    def wait_ready(self, items: list[Rented], deadline: float) -> None:
        """Poll until every item is READY (``item.seen``), failed, or ``deadline`` (monotonic) passes."""
        waiting = [i for i in items if i.id is not None]
        while waiting:
            for item in list(waiting):
                assert item.id is not None
                try:
                    item.seen = self.api.get(item.id)
                except FleetError as exc:
                    log.warning("%s: status unknown: %s", item.name, exc)
                    continue
                state = item.seen.state if item.seen else CloudState.GONE
                if state in (CloudState.READY, CloudState.FAILED, CloudState.GONE):
                    waiting.remove(item)
            if not waiting or time.monotonic() >= deadline or self.closing.is_set():
                return
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def terminate(self, item: Rented) -> None:
        """Terminate ``item`` (found by name when its id was never learnt) and wait until the cloud says so."""
        if item.terminated:
            return
        if item.id is None:
            found = self.find(item.cloud_name or item.name)
            if found is None:  # never made (or the API is down: leftovers() and fleet sweep look again)
                item.terminated = True
                return
            item.id = found.id
            self.note(item.name, None, cloud_id=item.id)
        deadline = time.monotonic() + TERMINATE_TIMEOUT_S
        while True:
            try:
                self.api.terminate(item.id)
                break
            except (CloudApiError, FleetTimeout) as exc:  # the cloud may have acted on it: sent again, harmless
                if not transient(exc) or time.monotonic() >= deadline:
                    raise
                log.warning("%s: %s; sending the terminate again", item.name, exc)
                time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
        while True:
            try:
                seen = self.api.get(item.id)
            except (CloudApiError, FleetTimeout) as exc:  # a 5xx, no answer in time, or 429s beyond the client's
                if not transient(exc) or time.monotonic() >= deadline:  # patience: not a failed terminate
                    raise
                log.warning("%s: status unknown after terminate: %s; asking again", item.name, exc)
                time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))
                continue
            if seen is None or seen.state is CloudState.GONE:
                item.terminated = True
                return
            if time.monotonic() >= deadline:
                status = seen.status or seen.state.value
                raise TeardownIncomplete(f"{self.api.name}: {item.name} ({item.id}) still {status} "
                                         f"{TERMINATE_TIMEOUT_S:.0f}s after terminate; `teibatch fleet sweep` retries")
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def give_back(self, item: Rented) -> FleetError | None:
        """Terminate an instance that will not serve, recorded with why (``item.error``): destroyed, or
        unknown when the terminate failed; that failure is returned (teardown tries again)."""
        try:
            self.terminate(item)
        except FleetError as exc:
            self.note(item.name, InstanceState.UNKNOWN, error=f"{item.error}; terminate: {exc}")
            return exc
        self.note(item.name, InstanceState.DESTROYED, error=item.error)
        return None

    def taken_back(self, names: list[str]) -> list[tuple[Rented, str]]:
        """Which of the serving instances ``names`` the cloud took back, and its word for it: those it
        stopped (or that broke), and those it no longer knows. One listing of the run's instances, and a
        look-up of each one the listing leaves out; raises :class:`FleetError` when the cloud cannot be asked."""
        listed = {found.id: found for found in self.api.list(self.prefix)}   # by id: names carry the attempt
        taken = []
        for name in names:
            item = self.rented[name]
            seen = listed.get(item.id) if item.id is not None else None
            if seen is None and item.id is not None:
                seen = self.api.get(item.id)
            if seen is None or seen.state in (CloudState.GONE, CloudState.FAILED):
                item.seen = seen
                taken.append((item, (seen.status or seen.state.value) if seen is not None else "no longer listed"))
        return taken

    def leftovers(self) -> list[CloudInstance]:
        """Every live instance of this run in the cloud, found by the run's label (the name prefix): also those
        no call ever answered for. Waits up to :data:`LATE_LISTING_S` for the instances of create calls that
        never answered (:attr:`unanswered`) to be listed: a cloud may list an instance a while after making it.
        A listing that fails for a while (:func:`transient`) is asked again, for up to :data:`TERMINATE_TIMEOUT_S`."""
        now = time.monotonic()
        deadline, give_up = now + LATE_LISTING_S, now + TERMINATE_TIMEOUT_S
        while True:
            try:
                listed = self.api.list(self.prefix)
            except FleetError as exc:
                if not transient(exc) or time.monotonic() >= give_up:
                    raise
                log.warning("%s: could not list the run's instances: %s; asking again", self.prefix, exc)
                time.sleep(POLL_S)
                continue
            live = [i for i in listed if i.state is not CloudState.GONE]
            self.unanswered -= {found.name for found in live}
            if not self.unanswered or time.monotonic() >= deadline:
                if self.unanswered:
                    log.warning("%s: never listed after their create calls timed out (fleet sweep looks again)",
                                ", ".join(sorted(self.unanswered)))
                return live
            time.sleep(min(POLL_S, max(0.0, deadline - time.monotonic())))

    def terminate_all(self, *, keep: Collection[str] = ()) -> list[str]:
        """Terminate every instance carrying the run's label (known ones, and any other the cloud lists: by its
        id, whatever the run remembers) but the servers named in ``keep``; return problems."""
        if self._pool is not None:  # the run is over: nothing more is served (tunnels were closed before)
            self._pool.shutdown(wait=False)
            self._pool = None
        problems = []
        strays: list[Rented] = []
        try:
            for found in self.leftovers():
                slot = slot_of(found.name)
                item = self.rented.setdefault(slot, Rented(slot, cloud_name=found.name))
                if item.id == found.id:
                    item.terminated = False
                elif item.id is None:
                    item.id, item.cloud_name, item.terminated = found.id, found.name, False
                elif slot not in keep:  # an earlier attempt's instance, or another of the same name: by its id
                    strays.append(Rented(slot, id=found.id, cloud_name=found.name))
        except FleetError as exc:
            problems.append(f"could not list the run's instances: {exc}")
        for stray in strays:
            try:
                self.terminate(stray)
            except FleetError as exc:
                problems.append(f"{stray.cloud_name} ({stray.id}): {exc}")
                continue
            log.warning("%s: %s (%s) carried the run's label but was not the instance the run knew: terminated",
                        stray.name, stray.cloud_name, stray.id)
            self.note(stray.name, None, strays_terminated=[stray.id])
        for item in self.rented.values():
            if item.terminated or item.name in keep:  # given back earlier in the run (and recorded then), or kept
                continue
            try:
                self.terminate(item)
            except FleetError as exc:
                problems.append(f"{item.name}: {exc}")
                self.note(item.name, InstanceState.UNKNOWN, error=str(exc))
                continue
            self.note(item.name, InstanceState.DESTROYED)
        return problems
