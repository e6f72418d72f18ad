"""A run's servers from start to end: up → endpoints → down → export (verified) → destroy.

:func:`session` is what the pipeline runs a job inside; :func:`finish` is its ending, which
``teibatch fleet sweep`` also runs for what a killed driver left. The order is what keeps money and
data safe:

1. ``down``: remove the servers (containers) first, whatever happened: they cost money and hold no
   data (the model lives in the volume). SIGINT and SIGTERM wait until this is done.
2. ``export_volumes``: copy each volume to ``export.to`` and verify it against the host's sha256sum.
3. ``destroy``: remove volumes and run ``destroy_command`` only for instances whose export was
   verified, or for all when the export is waived. The others are kept, and the run fails with
   :class:`~teibatch.errors.ExportFailed`, which says so.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import FrameType
from typing import Any

from teibatch.endpoint import Endpoint
from teibatch.errors import ExportFailed, FleetError, TeardownIncomplete
from teibatch.fleet.base import Capability, DestroysHosts, ExportsVolumes, LaunchSpec, Provider, supports

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExportPlan:
    """The job file's ``export`` section, as the fleet needs it."""

    to: str | None = None
    waive: bool = False
    timeout: float | None = None
    storage_options: Mapping[str, Any] = field(default_factory=dict)


@contextmanager
def session(provider: Provider, spec: LaunchSpec, export: ExportPlan | None = None) -> Iterator[list[Endpoint]]:
    """The provider's healthy endpoints for the block; :func:`finish` however the block ends.

    A teardown problem (containers left, export not verified) is raised after the block; it wins over
    an error of the block itself, which stays attached as ``__context__``, because it is the one that
    costs money.
    """
    export = export or ExportPlan()
    try:
        yield provider.up(spec)
    finally:
        finish(provider, export)


def finish(provider: Provider, export: ExportPlan) -> None:
    """Remove the servers, export their volumes, destroy what may be destroyed; raise what is left."""
    problems: list[FleetError] = []
    held: list[int] = []
    with _signals_deferred(held):
        try:
            provider.down()
        except TeardownIncomplete as exc:
            problems.append(exc)
    export_error: ExportFailed | None = None
    if export.to and supports(provider, Capability.EXPORT):
        assert isinstance(provider, ExportsVolumes)
        try:
            provider.export_volumes(export.to, storage_options=export.storage_options, timeout=export.timeout)
        except ExportFailed as exc:
            export_error = exc
        except KeyboardInterrupt:
            export_error = ExportFailed("the export was interrupted (Ctrl-C or SIGTERM)")
        if export_error is not None:
            log.error("%s", export_error)
    kept: list[str] = []
    if supports(provider, Capability.DESTROY):
        assert isinstance(provider, DestroysHosts)
        with _signals_deferred(held):
            try:
                kept = provider.destroy(waive_export=export.waive)
            except TeardownIncomplete as exc:
                problems.append(exc)
    if export_error is not None and export.waive:
        log.warning("export failed but export.waive is set: destroyed anyway")
    elif kept or export_error is not None:
        why = str(export_error) if export_error else "no verified export (export.to is not set)"
        problems.append(ExportFailed(
            f"{len(kept)} instance(s) kept, nothing holding data destroyed ({', '.join(kept) or 'none'}): {why}. "
            "Their containers are removed. Run `teibatch fleet sweep` to export and destroy them, "
            "or `teibatch fleet sweep --waive-export` to destroy them without a copy"))
    if problems:
        if len(problems) == 1:
            raise problems[0]
        first = next((p for p in problems if not isinstance(p, ExportFailed)), problems[0])
        raise type(first)(" | ".join(str(p) for p in problems))
    if held:
        raise KeyboardInterrupt


@contextmanager
def _signals_deferred(received: list[int]) -> Iterator[None]:
    """Hold SIGINT and SIGTERM while the block runs (its steps are bounded); ``received`` collects them."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def hold(signum: int, frame: FrameType | None) -> None:
        received.append(signum)
        log.warning("teardown in progress: %s will act once the servers are removed", signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, hold) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
