"""One run per output at a time: a lock object beside the manifest, held for the whole run.

``_lock.json`` names the holder (run id, host, pid, start time) and carries a heartbeat the holder
rewrites every :data:`HEARTBEAT_S` seconds. It is created with an exclusive create — ``O_EXCL`` on
a local disk, ``If-None-Match: *`` on S3 and S3-compatible stores that honour it — so of two runs
starting together exactly one gets it; the other stops with :class:`OutputLocked` before it has
written anything.

A lock left by a run that died (SIGKILL, a lost machine) is taken over when its holder is provably
gone — same host, its pid no longer alive — or its heartbeat is older than :data:`STALE_AFTER_S`.
Taking over is a delete and a fresh exclusive create, which two runs could interleave: each run
therefore re-reads the lock before every manifest write (:meth:`OutputLock.check`) and stops with
:class:`LockLost` if it is no longer the holder, so at most one of them ever commits.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
from dataclasses import asdict, dataclass
from datetime import UTC, datetime

import orjson

from teibatch.errors import LockLost, OutputLocked, SinkError
from teibatch.sink.store import OutputStore

log = logging.getLogger(__name__)

LOCK = "_lock.json"
# How often the holder rewrites its heartbeat, and how old one must be before another run takes over.
HEARTBEAT_S = 15.0
STALE_AFTER_S = 120.0


@dataclass(frozen=True)
class LockHolder:
    """What ``_lock.json`` says about the run that holds the output."""

    run_id: str
    host: str
    pid: int
    started_at: str
    heartbeat_at: str

    def describe(self) -> str:
        return f"run {self.run_id} (pid {self.pid} on {self.host}, started {self.started_at})"

    def age_seconds(self) -> float:
        """Seconds since the holder's last heartbeat (by this machine's clock)."""
        return (datetime.now(UTC) - datetime.fromisoformat(self.heartbeat_at)).total_seconds()

    def stale(self) -> bool:
        """True when the holder is gone (:meth:`gone`) or its heartbeat is older than :data:`STALE_AFTER_S`:
        no run is writing, and the next one takes the lock over."""
        return self.gone() or self.age_seconds() > STALE_AFTER_S

    def gone(self) -> bool:
        """True when the holder ran on this host and its process no longer exists."""
        if self.host != socket.gethostname():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


class OutputLock:
    """The lock of one output for one run: :meth:`acquire`, :meth:`check` before commits, :meth:`release`."""

    def __init__(self, store: OutputStore, run_id: str, *, heartbeat: float = HEARTBEAT_S) -> None:
        self.store = store
        self.run_id = run_id
        self.heartbeat = heartbeat
        self.took_over: LockHolder | None = None
        self._started_at = _now()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        """Take the lock or raise :class:`OutputLocked` naming the run that holds it."""
        holder = None
        for _ in range(2):  # released between our create and our read: try once more
            if self._create():
                self._start_heartbeat()
                return
            holder = self.holder()
            if holder is not None:
                break
        if holder is not None and not holder.stale():
            raise OutputLocked(
                f"another teibatch run is writing {self.store.url}: {holder.describe()}, last heartbeat "
                f"{holder.age_seconds():.0f}s ago; this run did nothing. Wait for it to finish, or, if it "
                f"is dead on another machine, its lock is taken over {STALE_AFTER_S:.0f}s after its last "
                f"heartbeat (remove {self.store.url}/{LOCK} to take it over now)")
        self.store.remove(LOCK)
        if not self._create():
            winner = self.holder()
            raise OutputLocked(f"another teibatch run took over the stale lock of {self.store.url} first"
                               f"{': ' + winner.describe() if winner else ''}; this run did nothing")
        self.took_over = holder
        if holder is not None:  # the run says so itself (event lock_taken_over)
            log.info("took over the lock of %s from %s (%s)", self.store.url, holder.describe(),
                        "its process is gone" if holder.gone() else f"no heartbeat for {holder.age_seconds():.0f}s")
        self._start_heartbeat()

    def holder(self) -> LockHolder | None:
        """The run that holds the lock now, or ``None`` when nobody does."""
        data = self.store.read_json(LOCK, fresh=True)
        if data is None:
            return None
        try:
            return LockHolder(**{name: data[name] for name in LockHolder.__dataclass_fields__})
        except (KeyError, TypeError) as exc:
            raise SinkError(f"{self.store.url}/{LOCK} is not a teibatch lock ({exc}); remove it if no run "
                            "is writing this output") from exc

    def check(self) -> None:
        """Raise :class:`LockLost` unless this run still holds the lock (called before every manifest write)."""
        holder = self.holder()
        if holder is None or holder.run_id != self.run_id:
            taken = f"it is now held by {holder.describe()}" if holder else "it was removed"
            raise LockLost(f"this run lost the lock of {self.store.url}: {taken}; it stopped before writing "
                           "the manifest again, and its committed shards stay committed")

    def release(self) -> None:
        """Stop the heartbeat and remove the lock if it is still this run's."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with contextlib.suppress(SinkError):
            holder = self.holder()
            if holder is not None and holder.run_id == self.run_id:
                self.store.remove(LOCK)

    def _record(self) -> bytes:
        holder = LockHolder(self.run_id, socket.gethostname(), os.getpid(), self._started_at, _now())
        return orjson.dumps(asdict(holder), option=orjson.OPT_INDENT_2)

    def _create(self) -> bool:
        """Create the lock exclusively; False when it exists already."""
        try:
            self.store.create_exclusive(LOCK, self._record())
        except FileExistsError:
            return False
        return True

    def _start_heartbeat(self) -> None:
        self._thread = threading.Thread(target=self._beat, name="teibatch-lock-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            try:
                holder = self.holder()
                if holder is None or holder.run_id != self.run_id:
                    return  # lost: the next check() says so where it can stop the run
                self.store.write_atomic(LOCK, lambda handle: handle.write(self._record()))
            except (SinkError, OSError) as exc:
                log.warning("could not refresh the lock of %s: %s", self.store.url, exc)


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")

