"""What Ray's own processes cost a run: the CPU seconds of a private Ray's background, for the run report.

What counts: every process of the Ray this driver's node started (the GCS server and the raylet)
and everything under them (the dashboard agent, the runtime-env agent, the dashboard when asked for,
and Python workers that did no work of the run: started, idle, or stopped idle). What does not: a
worker once it is seen running one of the run's tasks or actors (its title is then ``ray::<name>``);
from then on its whole CPU, its start-up included, is the run's. The driver and the servers are not
Ray's. Processes are sampled every :data:`SAMPLE_INTERVAL_S`, so a worker that ran a task only
between two samples counts as idle, and a process that ends keeps the CPU of its last sample.

A Ray the run started itself counts from its processes' start (its start-up is the run's cost); a
Ray already running in the driver (benchmarks, tests) counts from the run's start. A joined cluster
started nothing in this driver: its figure is unknown (``None``).
"""

from __future__ import annotations

import contextlib
import threading

import psutil
import ray

SAMPLE_INTERVAL_S = 1.0
"""Each sample scans the machine's process table: 4-6 ms of the driver's CPU with 130 processes,
which at half a second was some 15 % of the figure measured. A worker doing the run's work keeps its
title for seconds (a shard task) or for its life (an actor), so a second still tells them apart."""
# Titles Ray's own processes carry; any other ``ray::`` title is a worker running the run's work.
RAY_OWN_TITLES = frozenset({"ray::IDLE", "ray::DashboardAgent", "ray::RuntimeEnvAgent"})


class RayUpkeep:
    """Samples the CPU seconds of the local Ray's own processes in a thread, from :meth:`start` to :meth:`stop`."""

    def __init__(self, *, from_process_start: bool) -> None:
        self._from_start = from_process_start
        self._roots = _node_process_ids()
        self._baseline: dict[int, float] = {}
        self._last: dict[int, float] = {}
        self._busy: set[int] = set()  # workers seen running the run's work
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def known(self) -> bool:
        """Whether this driver's node started Ray's processes (it did not for a joined cluster)."""
        return bool(self._roots)

    def start(self) -> None:
        """Take the first sample, then sample in the background until :meth:`stop`."""
        if not self.known:
            return
        self._sample()
        if not self._from_start:
            self._baseline = dict(self._last)
        self._thread = threading.Thread(target=self._loop, name="teibatch-ray-upkeep", daemon=True)
        self._thread.start()

    def stop(self) -> float | None:
        """Stop sampling; the CPU seconds Ray's own processes burned, or ``None`` where that is unknown."""
        if not self.known or self._thread is None:
            return None
        self._stop.set()
        self._thread.join()
        self._sample()
        return sum(max(cpu - self._baseline.get(pid, 0.0), 0.0)
                   for pid, cpu in self._last.items() if pid not in self._busy)

    def _loop(self) -> None:
        while not self._stop.wait(SAMPLE_INTERVAL_S):
            self._sample()

    def _sample(self) -> None:
        for process in _tree(self._roots):
            # A process may end between listing and reading: it keeps its last sample.
            with contextlib.suppress(psutil.Error):
                times = process.cpu_times()
                title = process.cmdline()[:1]
                if title and title[0].startswith("ray::") and title[0].split()[0] not in RAY_OWN_TITLES:
                    self._busy.add(process.pid)
                self._last[process.pid] = times.user + times.system


def _node_process_ids() -> list[int]:
    """The processes this driver's Ray node started (none when it joined a cluster)."""
    node = getattr(ray._private.worker.global_worker, "node", None)
    started = getattr(node, "all_processes", None) or {}
    return [info.process.pid for infos in started.values() for info in infos if info.process is not None]


def _tree(roots: list[int]) -> list[psutil.Process]:
    """``roots`` and every process under them, from one scan of the process table (``children`` scans
    it once a root)."""
    below: dict[int, list[psutil.Process]] = {}
    for process in psutil.process_iter(["ppid"]):
        below.setdefault(process.info["ppid"], []).append(process)
    found: list[psutil.Process] = []
    for pid in roots:
        with contextlib.suppress(psutil.Error):
            found.append(psutil.Process(pid))
            waiting, seen = [pid], {pid}
            while waiting:
                under = [process for process in below.get(waiting.pop(), []) if process.pid not in seen]
                found.extend(under)
                seen.update(process.pid for process in under)
                waiting.extend(process.pid for process in under)
    return found
