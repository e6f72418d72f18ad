"""Which Ray a run uses: a private one of its own, or a cluster it was told to join — never one it stumbled on.

Without ``--ray-address`` (or ``RAY_ADDRESS``), ``ray.init()`` would join any cluster that
``ray start`` left running on the machine, whoever started it and whatever its Ray version. A run
starts its own local Ray instead (``address="local"``). Ray protects a new local cluster with token
authentication unless ``RAY_AUTH_MODE`` says otherwise (its token lives in ``~/.ray/auth_token``),
so nothing else on the network can use it; its notice about that, and Ray's other start-up notices,
do not reach the user's terminal. ``--ray-address auto`` joins the local cluster on
purpose; ``ray job submit`` sets ``RAY_ADDRESS`` for its entrypoint, which is then joined.
"""

from __future__ import annotations

import importlib
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import ray

from teibatch.errors import RayUnavailable
from teibatch.pipeline.ray_upkeep import RayUpkeep

if TYPE_CHECKING:
    from teibatch.pipeline.summary import RunSummary

REACH_TIMEOUT_S = 5.0


class RayStart:
    """A Ray starting in the background, so that its start-up overlaps the servers' start-up.

    Starting a local Ray takes seconds (its processes boot one after the other), and so do the
    servers; the run needs Ray only once the servers are up. :meth:`wait` is called before the
    first Ray call and raises what the start raised. ``ray.init`` off the main thread leaves the
    SIGTERM handler alone, which is what a run wants anyway.

    The thread that starts Ray lives until Ray is shut down, and shuts it down itself: Ray ties its
    processes' lives to the *thread* that spawned them (Linux's parent-death signal), so a thread
    that ended after ``ray.init`` would take the local cluster down with it.

    Once Ray is up, a :class:`RayUpkeep` samples what Ray's own processes burn; :attr:`background_cpu_s`
    holds it after :meth:`close` (``None`` for a joined cluster).
    """

    def __init__(self, address: str | None) -> None:
        self.seconds = 0.0
        self.waited_seconds = 0.0
        self.background_cpu_s: float | None = None
        self._upkeep: RayUpkeep | None = None
        self._address = address
        self._error: BaseException | None = None
        self._ready = threading.Event()
        self._release = threading.Event()
        self._thread: threading.Thread | None = None
        if ray.is_initialized():
            self._watch(from_process_start=False)  # a Ray someone else started: from now on
            self._ready.set()
        else:
            if address is not None:
                _check_reachable(address)  # a wrong address is reported now, before any server starts
            self._thread = threading.Thread(target=self._hold, name="teibatch-ray", daemon=True)
            self._thread.start()

    def _hold(self) -> None:
        started = time.monotonic()
        try:
            _init(self._address)
        except BaseException as exc:  # handed to the main thread by wait()
            self._error = exc
            return
        finally:
            if self._error is None:
                self._watch(from_process_start=True)  # its start-up is this run's too
            self.seconds = time.monotonic() - started
            self._ready.set()
        self._release.wait()
        ray.shutdown()

    def _watch(self, *, from_process_start: bool) -> None:
        try:
            self._upkeep = RayUpkeep(from_process_start=from_process_start)
            self._upkeep.start()
        except Exception:  # a figure for the report is never a reason to fail the run: it stays unknown
            self._upkeep = None

    @property
    def ready(self) -> bool:
        """Whether Ray is up now (without waiting)."""
        return self._ready.is_set() and self._error is None

    def wait(self) -> None:
        """Block until Ray is up; raise :class:`RayUnavailable` if it could not start or be joined."""
        started = time.monotonic()
        self._ready.wait()
        self.waited_seconds += time.monotonic() - started
        if self._error is not None:
            raise self._error

    def close(self) -> None:
        """Shut down the Ray this started, once its start has finished (a half-started Ray cannot be stopped)."""
        self._ready.wait()  # the sampler is set up with Ray
        if self._upkeep is not None:
            self.background_cpu_s = self._upkeep.stop()
        self._release.set()
        if self._thread is not None:
            self._thread.join()


@contextmanager
def ray_session(address: str | None, summary: RunSummary) -> Iterator[RayStart]:
    """Ray for the length of the block: the one already initialised, ``address``, or a private local one.

    Ray starts in the background as the block begins; call ``wait()`` on what this yields before
    the first Ray call. Leaving the block shuts down a Ray that it started and writes its start
    times and its background CPU (``ray_background``) into ``summary``.
    """
    start = RayStart(address)
    try:
        yield start
    finally:
        start.close()
        summary.ray_background = start.background_cpu_s
        if start.seconds:
            summary.timings["ray_start_s"] = start.seconds
            summary.timings["ray_wait_s"] = start.waited_seconds


# Ray starts its worker processes at niceness 15, below its own services, the driver and any local
# server; the senders, which must turn each answer into the next request within milliseconds, then
# wait whenever any of those works (a worker process starting stalled a sender while the servers
# emptied; docs/client.md). A private Ray starts its workers at 0; the shard tasks lower their own
# priority (``pipeline/shard.py``), so on a full machine the senders come first.
#
# The rest trims what a private Ray does in the background to what a run uses (docs/benchmarks.md,
# "Ray's background"): no Python workers started ahead of need (the run starts its own tasks and
# actors; a prestarted worker that nothing uses burns CPU importing Ray and idles), no metrics
# collected or exported (nobody scrapes a private Ray; the run's own metrics are teibatch's), no
# task events for a dashboard that is not there, no per-handler event statistics.
WATCHED_RAY_SYSTEM_CONFIG: dict[str, object] = {
    "worker_niceness": 0,
    "enable_worker_prestart": False,
    "prestart_worker_first_driver": False,
}
LOCAL_RAY_SYSTEM_CONFIG: dict[str, object] = {
    **WATCHED_RAY_SYSTEM_CONFIG,
    "enable_metrics_collection": False,
    "enable_timeline": False,
    "task_events_report_interval_ms": 0,
    "event_stats": False,
}
"""A private Ray's system config; with its dashboard asked for, :data:`WATCHED_RAY_SYSTEM_CONFIG`:
the metrics and task events the dashboard's pages show stay on."""
# How every run meets Ray, private or joined: no dashboard, no worker logs in the terminal.
_INIT_OPTIONS: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                                 "logging_level": logging.WARNING, "configure_logging": False}
# Set to 1, a private Ray starts its dashboard (and the API server behind it) for someone to watch.
DASHBOARD_ENV = "TEIBATCH_RAY_DASHBOARD"


def start_local_ray(num_cpus: int | None = None) -> None:
    """``ray.init`` a private local Ray as a run starts its own (also for benchmarks that start it first).

    Without :data:`IDLE_SERVICES` and with :data:`LOCAL_RAY_SYSTEM_CONFIG`; ``num_cpus``: the CPUs Ray
    declares (default: the machine's). With ``TEIBATCH_RAY_DASHBOARD=1`` it starts the dashboard, with
    the metrics and task events its pages show (:data:`WATCHED_RAY_SYSTEM_CONFIG`).
    """
    dashboard = os.environ.get(DASHBOARD_ENV) == "1"
    options = {**_INIT_OPTIONS, "include_dashboard": dashboard}
    config = WATCHED_RAY_SYSTEM_CONFIG if dashboard else LOCAL_RAY_SYSTEM_CONFIG
    skipped = tuple(name for name in IDLE_SERVICES if not (dashboard and name == "start_api_server"))
    with _quiet_ray_start(), _without_idle_services(skipped):
        ray.init(address="local", num_cpus=num_cpus, _system_config=config, **options)


def _init(address: str | None) -> None:
    try:
        if address is None:
            start_local_ray()
        else:
            with _quiet_ray_start():
                ray.init(address=address, **_INIT_OPTIONS)
    except Exception as exc:  # ray raises RuntimeError, ConnectionError, ValueError... for the same thing
        raise RayUnavailable(_explain(address, exc)) from exc


@contextmanager
def _quiet_ray_start() -> Iterator[None]:
    """Ray's start-up notices (its token, a system config it calls unstable) stay off the user's terminal."""
    quiet = [logging.getLogger(name) for name in ("ray", "ray._private.authentication.authentication_token_setup")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


# The Ray head's Python services a private, single-run Ray has no use for: the dashboard's API
# server (nothing else may reach this Ray, and ``include_dashboard=False`` still starts it for usage
# statistics), the autoscaler's monitor (nothing to scale) and the log monitor (``log_to_driver=False``:
# the driver reads no worker logs). Each is a Python process importing Ray: together a large share of
# a small run's start (docs/benchmarks.md).
IDLE_SERVICES = ("start_api_server", "start_monitor", "start_log_monitor")


@contextmanager
def _without_idle_services(skipped: tuple[str, ...] = IDLE_SERVICES) -> Iterator[None]:
    """While a private Ray starts, its head skips ``skipped`` (of :data:`IDLE_SERVICES`).

    Ray has no public switch for them (``ray start`` has hidden ones for two), so the head node's
    methods that start them are swapped for no-ops for the length of ``ray.init`` — only where all
    three exist as expected; any other Ray starts in full. The tests start a run this way and check
    that these processes are absent and the run's vectors complete.
    """
    try:
        node_class = getattr(importlib.import_module("ray._private.node"), "Node", None)
    except ImportError:
        node_class = None
    originals = {name: getattr(node_class, name, None) for name in IDLE_SERVICES}
    if node_class is None or not all(callable(method) for method in originals.values()):
        yield
        return
    for name in skipped:
        setattr(node_class, name, _skip_service)
    try:
        yield
    finally:
        for name, method in originals.items():
            setattr(node_class, name, method)


def _skip_service(self: object, **_: object) -> None:
    """Start nothing (see :data:`IDLE_SERVICES`)."""


def _check_reachable(address: str) -> None:
    """Fail in seconds on an address where nothing listens (``ray.init`` itself waits minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=REACH_TIMEOUT_S).close()
    except OSError as exc:
        raise RayUnavailable(_explain(address, exc)) from exc


def _explain(address: str | None, exc: Exception) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    if address is None:
        return f"could not start a local Ray for this run: {first}"
    return (f"could not join the Ray cluster at {address!r} (from --ray-address or RAY_ADDRESS): {first}; "
            "check the address and that the cluster runs the same Ray version as this teibatch, or leave "
            "--ray-address out to run on a private local Ray")

