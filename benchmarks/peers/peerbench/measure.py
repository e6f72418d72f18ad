"""Run one contestant in its own process under a time limit; measure its wall time, CPU and memory.

The harness makes itself a *child subreaper* (Linux ``PR_SET_CHILD_SUBREAPER``): processes the
contestant starts and leaves behind (Ray's workers, its GCS and raylet) are handed to the harness
instead of to init, so it can stop them. CPU seconds are the machine's busy CPU time across the run
(``/proc/stat`` through psutil: every core, niced work included) less the servers' and the
harness's own: on an otherwise idle machine, the contestant's whole process tree. Not
``getrusage(RUSAGE_CHILDREN)``: Ray's raylet ignores ``SIGCHLD``, so the CPU of its worker
processes (shard tasks, actors, Ray Data's operators) never reaches any parent's account.

Peak memory is the largest sum of the resident set sizes of the
contestant's whole process tree, sampled every 0.25 s with psutil (pages shared between processes,
such as Ray's object store, count once per process that maps them).
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import resource
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1
SAMPLE_S = 0.25
LEFTOVER_GRACE_S = 10.0


def become_subreaper() -> None:
    """Adopt the contestants' orphaned descendants (Linux only; elsewhere CPU of orphans is missed)."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _die_with_harness() -> None:
    """In the child before exec: get SIGKILL if the harness dies (a stopped benchmark leaves nothing running)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


@dataclass
class Measurement:
    wall_s: float
    cpu_s: float
    peak_mib: float
    exit_code: int | None
    status: str           # done, crashed, time limit, or what ``stop_when`` said (stalled, killed)
    error: str            # one line when it did not finish


def _machine_busy() -> float:
    """CPU seconds the machine has been busy, over all cores (user, nice, system, interrupts)."""
    times = psutil.cpu_times()
    idle = times.idle + sum(getattr(times, name, 0.0) for name in ("iowait", "steal", "guest", "guest_nice"))
    return sum(times) - idle


def _own_cpu(pids: set[int]) -> float:
    """CPU seconds of the harness itself and of the live processes ``pids`` (the servers)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    total = usage.ru_utime + usage.ru_stime
    for pid in pids - {os.getpid()}:
        with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
    return total


def _tree(root: psutil.Process, family: set[int], exclude: set[int]) -> list[psutil.Process]:
    """Live processes of the contestant: its descendants, and orphans the harness adopted."""
    procs: dict[int, psutil.Process] = {}
    try:
        procs[root.pid] = root
        for child in root.children(recursive=True):
            procs[child.pid] = child
    except psutil.NoSuchProcess:
        pass
    for child in psutil.Process().children(recursive=False):
        if child.pid not in exclude and child.pid != root.pid:
            procs[child.pid] = child
            try:
                for grandchild in child.children(recursive=True):
                    procs[grandchild.pid] = grandchild
            except psutil.NoSuchProcess:
                pass
    family.update(procs)
    return list(procs.values())


def _rss_mib(procs: list[psutil.Process]) -> float:
    total = 0
    for proc in procs:
        try:
            total += proc.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return total / 2**20


def _stop(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.send_signal(signal.SIGKILL)
        except psutil.NoSuchProcess:
            continue


def _reap_adopted(exclude: set[int], deadline: float) -> None:
    """Wait for the adopted leftovers to end (kill them at ``deadline``) and collect their CPU time."""
    while True:
        leftovers = [c for c in psutil.Process().children() if c.pid not in exclude]
        for child in leftovers:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(child.pid, os.WNOHANG)
        leftovers = [c for c in leftovers if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
        if not leftovers:
            return
        if time.monotonic() > deadline:
            _stop(leftovers)
            for child in leftovers:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(child.pid, 0)
            return
        time.sleep(0.1)


def run_measured(command: list[str], *, cwd: Path, env: dict[str, str], limit_s: float, log: Path, result: Path,
                 exclude: set[int], stop_when: Callable[[float], str | None] | None = None) -> Measurement:
    """Run ``command`` to its end, past ``limit_s``, or until ``stop_when(elapsed)`` names a reason to stop it.

    ``exclude``: pids of the harness's other children (the servers), never counted or stopped.
    ``result``: the contestant's result file (see ``contestants.common``).
    """
    result.unlink(missing_ok=True)
    others = set(exclude)
    cpu_before = _machine_busy() - _own_cpu(others)
    started = time.monotonic()
    with open(log, "wb") as log_handle:
        popen = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=log_handle,
                                 stderr=subprocess.STDOUT, start_new_session=True,
                                 preexec_fn=_die_with_harness if sys.platform == "linux" else None)
    root = psutil.Process(popen.pid)
    family: set[int] = {popen.pid}
    exclude = set(exclude) | {os.getpid()}
    peak = 0.0
    status = ""
    while popen.poll() is None:
        procs = _tree(root, family, exclude)
        peak = max(peak, _rss_mib(procs))
        if time.monotonic() - started > limit_s:
            status = "time limit"
        elif stop_when is not None:
            status = stop_when(time.monotonic() - started) or ""
        if status:
            _stop(procs)
            popen.wait()
            break
        time.sleep(SAMPLE_S)
    wall = time.monotonic() - started
    _stop([p for p in _tree(root, family, exclude) if p.pid != popen.pid] if status else [])
    _reap_adopted(exclude | {popen.pid}, time.monotonic() + LEFTOVER_GRACE_S)
    cpu = _machine_busy() - _own_cpu(others) - cpu_before
    error = ""
    if not status:
        outcome = json.loads(result.read_text()) if result.exists() else {"status": "crashed", "error": ""}
        status = outcome["status"]
        error = outcome.get("error", "")
        if status == "done" and popen.returncode != 0:
            status, error = "crashed", f"exit code {popen.returncode}"
        if status == "crashed" and not error:
            error = _last_error_line(log) or f"exit code {popen.returncode}"
    elif status == "time limit":
        error = f"time limit of {limit_s:.0f} s"
    return Measurement(wall, cpu, peak, popen.returncode, status, error)


def _last_error_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    for line in reversed(lines):
        if "Error" in line or "Exception" in line:
            return line.strip()[:200]
    return lines[-1].strip()[:200] if lines else ""
