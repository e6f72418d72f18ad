"""The provider interface and the records that cross it.

A provider gets TEI servers for one run and takes them back::

    up(spec) ─► endpoints ─► [export_volumes(to)] ─► down() ─► [destroy()]
    launch or adopt,         copy volumes off,       remove      destroy what holds data
    wait healthy             verify checksums        servers     (volumes, hosts), only when
                                                                 their export was verified or waived

``up`` and ``down`` are what every provider does. Exporting volumes and destroying hosts are optional
operations: a provider that has them subclasses :class:`ExportsVolumes` / :class:`DestroysHosts`, and
callers ask :func:`supports` first; nothing raises ``NotImplementedError`` at run time.
:func:`teibatch.fleet.lifecycle.session` strings the steps together.
"""

from __future__ import annotations

import secrets
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from enum import Enum

import httpx

from teibatch.endpoint import Endpoint

HEALTH_POLL_S = 0.2


class InstanceState(str, Enum):
    """Where one launched server stands; recorded in the ledger after every step."""

    REQUESTED = "requested"  # written to the ledger before the launch: it may or may not exist
    RUNNING = "running"      # the container runs; not yet answering /health
    HEALTHY = "healthy"      # answering /health through its endpoint
    FAILED = "failed"        # never became healthy (or refused); still to be removed
    REMOVED = "removed"      # container gone; the host (and its volume) kept
    LOST = "lost"            # taken back by the cloud mid-run (a spot instance preempted, an instance stopped)
    DESTROYED = "destroyed"  # container gone and every configured destroy step done
    UNKNOWN = "unknown"      # could not be found out (host unreachable): treat as still running

    @classmethod
    def recorded(cls, value: object) -> InstanceState:
        """The state a ledger entry records as ``value``; ``UNKNOWN`` when it names none (or is missing)."""
        try:
            return cls(value)
        except ValueError:
            return cls.UNKNOWN

    @property
    def settled(self) -> bool:
        """Nothing of this instance can cost money any more."""
        return self is InstanceState.DESTROYED


class Capability(str, Enum):
    """Optional operations; see :func:`supports`."""

    LAUNCH = "launch"    # starts servers (rather than adopting running ones)
    EXPORT = "export"    # has volumes to copy off: ExportsVolumes
    DESTROY = "destroy"  # has data or hosts to destroy after export: DestroysHosts
    SWEEP = "sweep"      # instances are found again from the ledger by `teibatch fleet sweep`
    REPLACE = "replace"  # servers the cloud takes back mid-run are found and replaced: ReplacesLost


@dataclass(frozen=True)
class LaunchSpec:
    """What one run asks of a provider; ``run_id`` tags everything launched (launches are idempotent by it)."""

    run_id: str
    job_name: str = "teibatch-job"
    max_runtime: float | None = None
    import_from: str | None = None
    export_to: str | None = None


def new_run_id() -> str:
    """A run id for a provider used without one (``up()`` alone)."""
    return datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3)


@dataclass(frozen=True)
class Instance:
    """One server a provider launched or adopted; never holds a secret."""

    provider: str
    id: str
    run_id: str
    state: InstanceState
    host: str | None = None
    url: str | None = None
    details: Mapping[str, str] = field(default_factory=dict)


class Provider(ABC):
    """Gives TEI endpoints for one run, and takes back what it launched.

    ``capabilities`` lists the optional operations the provider has (see :class:`Capability`).
    """

    name: str
    capabilities: frozenset[Capability] = frozenset()

    @abstractmethod
    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        """Launch or adopt the servers and return once each returned endpoint answers ``/health``.

        Servers that never become healthy are left out (and removed by ``down``); with none healthy,
        raise :class:`~teibatch.errors.CapacityUnavailable`. Calling ``up`` again for the same
        ``spec.run_id`` launches nothing twice.
        """

    @abstractmethod
    def down(self) -> None:
        """Stop or remove every server ``up`` launched; nothing holding data is destroyed here.

        Idempotent, bounded in time, and safe after a failed or partial ``up``. Raises
        :class:`~teibatch.errors.TeardownIncomplete` naming what is still running.
        """

    def instances(self) -> list[Instance]:
        """What this provider launched or adopted in this process, as last seen."""
        return []


class ExportsVolumes(ABC):
    """Capability EXPORT: the servers keep their model weights in a volume worth copying off."""

    @abstractmethod
    def export_volumes(self, to: str, *, storage_options: Mapping[str, object] | None = None,
                       timeout: float | None = None) -> list[str]:
        """Copy every volume to ``to`` (any fsspec URL), checksum-verified; return the export URLs.

        An instance counts as exported only once its copy was verified. Raises
        :class:`~teibatch.errors.ExportFailed` naming the volumes that were not.
        """


class DestroysHosts(ABC):
    """Capability DESTROY: removing the servers is not all; volumes or hosts are destroyed after."""

    @abstractmethod
    def destroy(self, *, waive_export: bool = False) -> list[str]:
        """Destroy volumes and hosts (``destroy_command``) whose export was verified, or all when waived.

        Returns the instances kept because their export was not verified. Raises
        :class:`~teibatch.errors.TeardownIncomplete` when a destroy step failed.
        """


@dataclass(frozen=True)
class LostServer:
    """A server the cloud took back mid-run: its instance name, the URL it served on, and why (the cloud's word)."""

    name: str
    url: str
    reason: str


class ReplacesLost(ABC):
    """Capability REPLACE: the cloud may take servers back mid-run (spot capacity); they are found and replaced.

    Both methods are called from a thread other than the one that calls ``up`` and ``down``; ``down``
    stops a ``replace`` under way (it returns what it has) before it terminates anything.
    """

    def watch_interval(self) -> float:
        """Seconds between two calls of :meth:`lost`."""
        return 10.0

    @abstractmethod
    def lost(self) -> list[LostServer]:
        """The servers returned by ``up`` or ``replace`` that the cloud has taken back since the last call
        (each recorded in the ledger as lost, once); raises :class:`~teibatch.errors.FleetError` when the
        cloud could not be asked (ask again later)."""

    @abstractmethod
    def replace(self, lost: list[LostServer]) -> list[Endpoint]:
        """Give back the ``lost`` instances, and rent as many new servers, within the provider's replacement
        budget; return once each returned endpoint answers ``/health`` (fewer, or none, when the budget or
        the capacity ran out: the reasons are logged)."""


#: the capabilities that come with methods, and the interface that declares them
_INTERFACES: dict[Capability, type] = {Capability.EXPORT: ExportsVolumes, Capability.DESTROY: DestroysHosts,
                                       Capability.REPLACE: ReplacesLost}


def supports(provider: Provider, capability: Capability) -> bool:
    """Whether ``provider`` has ``capability`` (and the methods that go with it)."""
    if capability not in provider.capabilities:
        return False
    interface = _INTERFACES.get(capability)
    return interface is None or isinstance(provider, interface)


@contextmanager
def running(provider: Provider, spec: LaunchSpec | None = None) -> Iterator[list[Endpoint]]:
    """``provider.up()`` for the duration of the block; ``down()`` however the block ends.

    No export and no destroy: runs use :func:`teibatch.fleet.lifecycle.session`.
    """
    try:
        yield provider.up(spec)
    finally:
        provider.down()


def wait_healthy(url: str, deadline: float, *, alive: Callable[[], bool] | None = None) -> bool:
    """Poll ``url/health`` until it answers 200 or ``deadline`` (monotonic) passes.

    ``alive``, when given, is a callable returning False once the server process has died,
    which ends the wait early.
    """
    with httpx.Client(timeout=2.0) as http:
        while time.monotonic() < deadline:
            if alive is not None and not alive():
                return False
            try:
                if http.get(f"{url}/health").status_code == 200:
                    return True
            except httpx.HTTPError:
                pass
            time.sleep(HEALTH_POLL_S)
    return False
