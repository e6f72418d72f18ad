"""Container clouds: the rented container *is* TEI, reached on the public port the cloud maps to it.

What providers ``runpod`` and ``vast`` share. Each cloud module gives the offers a run may try, in
order, and the create call for one offer; this module does the rest, the same way for both:

* the run is recorded in the ledger, then :class:`~teibatch.fleet.rental.Rental` rents ``count``
  instances named ``teibatch-<run id>-<n>`` (found again by that name);
* each instance runs TEI's image for its card (``configs/images.yaml``, by compute capability)
  under the host-side deadline, its own entrypoint kept (``timeout -k 30s <startup + max_runtime +
  margin>s /entrypoint.sh …``: TEI's entrypoint sets up the CUDA compat libraries, then runs the
  router) with a per-run random ``--api-key`` (the ``API_KEY`` variable TEI reads: the port is
  public); the key is never logged nor written;
* an instance not ready and healthy within ``startup_timeout`` is terminated and replaced, at most
  ``max_replacements`` times in all (default: ``count``);
* an instance the cloud takes back mid-run (a spot instance preempted, an instance stopped) is
  found by :meth:`~ContainerCloudProvider.lost` and recorded in the ledger as lost, which ends its
  rented time; :meth:`~ContainerCloudProvider.replace` terminates it and rents another from the
  offers of now, within the same ``max_replacements``;
* ``down`` terminates every instance of the run, also those found only by name, but those a
  provider holds for an export (``vast`` with ``export.to``: its ``destroy`` ends them once their
  copy is verified); a replacement being rented stops first.
"""

from __future__ import annotations

import logging
import secrets
import threading
from abc import abstractmethod
from collections.abc import Mapping
from typing import Any, TypeVar

import teibatch.fleet.rental as rental_module
from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, FleetError, TeardownIncomplete
from teibatch.fleet.base import (
    Capability,
    Instance,
    InstanceState,
    LaunchSpec,
    LostServer,
    Provider,
    ReplacesLost,
    new_run_id,
    wait_healthy,
)
from teibatch.fleet.hosted import DEADLINE_MARGIN_S, DEFAULT_STARTUP_TIMEOUT_S, UNBOUNDED_RUNTIME_S
from teibatch.fleet.images import CONTAINER_PORT, KILL_AFTER_S, ImageChoice, choose_image
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import GpuWant, Offer, by_capacity, choose_offers, gpu_info
from teibatch.fleet.rental import CloudApi, CloudState, Rental, Rented

log = logging.getLogger(__name__)

P = TypeVar("P", bound="ContainerCloudProvider")


class ContainerCloudProvider(Provider, ReplacesLost):
    """``count`` containers rented from one container cloud, each the TEI image for its card.

    The containers are the servers, so ``down`` terminates them (but those :meth:`_held` for an
    export). Those the cloud takes back mid-run are replaced (:class:`~teibatch.fleet.base.ReplacesLost`).
    Subclasses give :meth:`create` (one instance from one offer) and, where the cloud needs it,
    :meth:`usable_offers` (the order offers are tried in) and :meth:`ledger_config`.
    """

    name: str
    noun = "instance"           # what the cloud calls an instance, for messages
    console = "the cloud's console"
    capabilities = frozenset({Capability.LAUNCH, Capability.SWEEP, Capability.REPLACE})

    def __init__(self, api: CloudApi, *, count: int, want: GpuWant, model_id: str | None, image: str | None = None,
                 server_args: tuple[str, ...] | list[str] = (), startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
                 max_replacements: int | None = None, payload_limit: int | None = None,
                 ledger: Ledger | None = None, capacity: str | None = None) -> None:
        self.api = api
        self.capacity = str(capacity or getattr(api, "capacity", "on-demand"))   # servers.capacity
        self.count = count
        self.want = want
        self.model_id = model_id
        self.image = image
        self.server_args = tuple(server_args)
        self.startup_timeout = startup_timeout
        self.max_replacements = count if max_replacements is None else max_replacements
        self.payload_limit = payload_limit
        self.ledger = ledger or Ledger()
        self.api_key = secrets.token_urlsafe(32)
        self.run_id: str | None = None
        self._rental: Rental | None = None
        self._urls: dict[str, str] = {}
        self._lost_replaced = 0
        self._deadline_s = 0
        # Held by lost() and replace() (another thread) and by down(), which never terminates mid-rent.
        self._renting = threading.Lock()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(count={self.count}, run_id={self.run_id!r})"

    @abstractmethod
    def create(self, name: str, offer: Offer, deadline_s: int) -> str:
        """Ask the cloud for instance ``name`` from ``offer`` (see :meth:`router_command`); its cloud id.

        Raises :class:`~teibatch.errors.CapacityUnavailable` when the offer is gone or full.
        """

    def ledger_config(self) -> dict[str, Any]:
        """What ``fleet sweep`` needs to know of the run, besides its instances (never a secret)."""
        return {"kind": self.name, "model_id": self.model_id, "capacity": self.capacity}

    def usable_offers(self) -> tuple[Offer, ...]:
        """The offers this run may try, best first (for ``capacity: any``, spot ones first);
        :class:`CapacityUnavailable` when there is none."""
        choice = choose_offers(list(by_capacity(self.api.offers(), self.capacity)), self.want, self.model_id,
                               image=self.image)
        if not choice.usable:
            raise CapacityUnavailable(f"{self.name}: no {self.capacity} GPU this job can rent now: "
                                      f"{choice.why_none()}")
        if self.capacity == "any" and not choice.usable[0].interruptible:
            log.info("%s: no spot offer fits the job; renting on-demand", self.name)
        return by_capacity(choice.usable, self.capacity)

    def router_command(self, offer: Offer, deadline_s: int) -> tuple[ImageChoice, list[str]]:
        """TEI's image for the offer's card, and the arguments of ``timeout`` that run the image's own
        entrypoint under the host-side deadline (``-k 30s <deadline>s /entrypoint.sh --model-id …``)."""
        gpu = gpu_info(offer)
        assert gpu is not None  # choose_offers kept only cards of a known compute capability
        choice = choose_image(gpu, override=self.image)
        return choice, ["-k", f"{KILL_AFTER_S}s", f"{deadline_s}s", choice.entrypoint, *self.router_args()]

    def router_args(self) -> list[str]:
        """The arguments of TEI's router for this run: ``--model-id <model>`` and ``servers.server_args``."""
        return [*(["--model-id", self.model_id] if self.model_id else []), *self.server_args]

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        spec = spec or LaunchSpec(run_id=new_run_id())
        if self._rental is not None:
            if self.run_id == spec.run_id:
                return self._endpoints()
            raise FleetError(f"this {self.name} provider already serves run {self.run_id}")
        self.run_id = spec.run_id
        self.ledger.begin(spec.run_id, provider=self.name, job=spec.job_name, export_to=spec.export_to,
                          config=self.ledger_config())
        self._rental = Rental(self.api, self.ledger, spec.run_id)
        self._deadline_s = int((spec.max_runtime or UNBOUNDED_RUNTIME_S) + self.startup_timeout + DEADLINE_MARGIN_S)
        reasons = self._fill(self.count, self.max_replacements)
        endpoints = self._endpoints()
        if not endpoints:
            raise CapacityUnavailable(f"{self.name}: no server became healthy: {'; '.join(reasons)}")
        if len(endpoints) < self.count:
            log.warning("%s: going on with %d of %d servers: %s", self.name, len(endpoints), self.count,
                        "; ".join(reasons))
        return endpoints

    def _fill(self, count: int, max_replacements: int) -> list[str]:
        """Rent until ``count`` more instances serve (see :meth:`Rental.fill`); why fewer did."""
        assert self._rental is not None
        return self._rental.fill(count, self.usable_offers(), lambda n, o: self.create(n, o, self._deadline_s),
                                 lambda item: self._serve(item, item.started + self.startup_timeout),
                                 startup_timeout=self.startup_timeout, max_replacements=max_replacements,
                                 noun=self.noun)

    @property
    def replacements_left(self) -> int:
        """What is left of ``max_replacements``: instances that never served and lost ones replaced use it."""
        used = (self._rental.never_served if self._rental is not None else 0) + self._lost_replaced
        return max(0, self.max_replacements - used)

    def watch_interval(self) -> float:
        return rental_module.WATCH_S

    def lost(self) -> list[LostServer]:
        with self._renting:
            rental = self._rental
            if rental is None or rental.closing.is_set() or not self._urls:
                return []
            found = []
            for item, reason in rental.taken_back(list(self._urls)):
                url = self._urls.pop(item.name)
                rental.note(item.name, InstanceState.LOST, error=f"taken back by {self.name}: {reason}")
                log.warning("%s: %s %s (%s) was taken back by the cloud: %s", self.name, self.noun, item.name, url,
                            reason)
                found.append(LostServer(item.name, url, reason))
            return found

    def replace(self, lost: list[LostServer]) -> list[Endpoint]:
        with self._renting:
            rental = self._rental
            if rental is None or rental.closing.is_set():
                return []
            for server in lost:  # a stopped instance may still bill its disk: give it back first
                item = rental.rented[server.name]
                try:
                    rental.terminate(item)
                except FleetError as exc:  # down() and fleet sweep try again
                    rental.note(item.name, InstanceState.UNKNOWN, error=f"terminate after loss: {exc}")
                    continue
                rental.note(item.name, InstanceState.DESTROYED)
            wanted = min(len(lost), self.replacements_left)
            if wanted < len(lost):
                log.warning("%s: servers.max_replacements (%d) used up: %d lost %s(s) not replaced", self.name,
                            self.max_replacements, len(lost) - wanted, self.noun)
            if wanted == 0:
                return []
            before = set(self._urls)
            try:
                reasons = self._fill(wanted, self.replacements_left - wanted)
            except FleetError as exc:
                reasons = [str(exc)]
            new = [name for name in self._urls if name not in before]
            self._lost_replaced += len(new)
            if len(new) < wanted:
                log.warning("%s: %d of %d replacement(s) serve: %s", self.name, len(new), wanted, "; ".join(reasons))
            return [Endpoint(self._urls[name], self.api_key, self.payload_limit) for name in new]

    def _serve(self, item: Rented, deadline: float) -> bool:
        """Wait for TEI's ``/health`` on a ready instance; give the instance back when it does not serve."""
        assert self._rental is not None
        seen = item.seen
        if seen is not None and seen.state is CloudState.READY and seen.address:
            host = f"{seen.address}:{seen.ports[CONTAINER_PORT]}"
            url = f"http://{host}"
            self._rental.note(item.name, InstanceState.RUNNING, host=host)
            closing = self._rental.closing
            problem = self._prepare(item, deadline)
            healthy = problem is None and wait_healthy(url, deadline, alive=lambda: not closing.is_set())
            if healthy:
                self._urls[item.name] = url
                self._rental.note(item.name, InstanceState.HEALTHY)
                return True
            item.error = ("the run ended before it served" if closing.is_set() else problem or
                          f"TEI did not answer /health on {url} within servers.startup_timeout "
                          f"({self.startup_timeout:.0f}s)")
        else:
            status = seen.status if seen else "unknown"
            item.error = f"not running within servers.startup_timeout ({self.startup_timeout:.0f}s; status {status})"
        self._rental.give_back(item)
        return False

    def _prepare(self, item: Rented, deadline: float) -> str | None:
        """What else a ready instance must do before its TEI is waited for (by ``deadline``, monotonic):
        ``None`` when done, else why not (the instance is then given back). Nothing, here."""
        return None

    def _held(self) -> frozenset[str]:
        """The instances ``down`` leaves running because they hold data still to export (a subclass that
        exports ends them in its ``destroy``, and releases the run there). None, here."""
        return frozenset()

    def _endpoints(self) -> list[Endpoint]:
        return [Endpoint(url, self.api_key, self.payload_limit) for url in self._urls.values()]

    def down(self) -> None:
        """Terminate every instance of the run (also those found only by name) but those :meth:`_held`;
        bounded, idempotent."""
        if self._rental is None:
            return
        self._rental.closing.set()  # a replacement being rented stops waiting; then nothing more is rented
        held = self._held()
        with self._renting:
            self._urls.clear()
            problems = self._rental.terminate_all(keep=held)
        if not held:
            self._release()
        if problems:
            raise TeardownIncomplete(f"run {self.run_id}: {self.name} {self.noun}s may still run: "
                                     f"{'; '.join(problems)}. They stop serving at their deadline but cost money "
                                     f"until terminated: run `teibatch fleet sweep`, or terminate them in "
                                     f"{self.console}")

    def _release(self) -> None:
        """Tell the ledger the driver is done with the run (what is left is for ``fleet sweep``)."""
        assert self._rental is not None  # down() and destroy() return before this when nothing was rented
        try:
            self.ledger.release(self._rental.run_id)
        except FleetError as exc:
            log.error("%s", exc)

    def instances(self) -> list[Instance]:
        if self._rental is None:
            return []
        listed = []
        for item in self._rental.rented.values():
            state = (InstanceState.DESTROYED if item.terminated else InstanceState.HEALTHY if item.name in self._urls
                     else InstanceState.UNKNOWN)
            listed.append(Instance(provider=self.name, id=item.name, run_id=self.run_id or "", state=state,
                                   host=item.seen.address if item.seen else None, url=self._urls.get(item.name),
                                   details={"cloud_id": item.id or "",
                                            "offer": item.offer.label if item.offer else ""}))
        return listed

    @classmethod
    def restore(cls: type[P], record: Mapping[str, Any], ledger: Ledger, api: Any) -> P:
        """The provider of a recorded run (for ``teibatch fleet sweep``): its instances as recorded."""
        provider = cls(api, count=0, want=GpuWant(), model_id=None, ledger=ledger)
        provider.run_id = str(record["run_id"])
        provider._rental = Rental.from_record(api, ledger, record)
        return provider
