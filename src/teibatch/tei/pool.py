"""A pool of TEI servers: in-flight budgets, adaptive windows, server choice, health and probing.

Each :class:`Server` holds the whole in-flight budget of one server (its :class:`ClientLimits`) and
an AIMD :class:`~teibatch.tei.window.ConcurrencyWindow` below it; inputs in flight to a server never
exceed its window, so they never exceed ``max_concurrent_requests``. One pool is meant to be the
only sender to its servers for a whole run, shared by every concurrent :func:`embed_texts` call on
its event loop (see ``pipeline/senders/``): whoever is sending right now uses the whole budget.

A server that fails :data:`DOWN_AFTER` times in a row (no answer, 5xx, or a wrong answer such as another
dimension or NaN values) is taken out and probed in the background: on ``/health``, then with a
real checked embedding (a server that answers 502 pages or wrong vectors, or never answers an
embedding, usually says 200 on ``/health`` all the same). It is put back when the probe passes;
with no server left for ``down_grace`` seconds, :meth:`EndpointPool.check_alive` raises
:class:`~teibatch.errors.CapacityUnavailable` naming each server's last fault (the run stops; the
same command resumes it).

A server the cloud took back (:meth:`EndpointPool.lose`, told by the driver) is out for good: its
requests in flight are called back at once and their texts sent to the other servers, without
counting as a failed try. While a replacement is on its way (:meth:`EndpointPool.expect`, then
:meth:`EndpointPool.add`), the pool waits for it even with no server left.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from teibatch.errors import CapacityUnavailable, TeiError
from teibatch.tei.client import EmbedRequest, TeiClient
from teibatch.tei.hedging import Flight, plan_copies
from teibatch.tei.info import ClientLimits
from teibatch.tei.window import DEFAULT_LATENCY_FACTOR, ConcurrencyWindow

DEFAULT_PROBE_INTERVAL_S = 1.0
DEFAULT_DOWN_GRACE_S = 30.0
DOWN_AFTER = 3


@dataclass
class ServerStats:
    """What one client did with one server."""

    requests: int = 0
    inputs: int = 0
    retries: int = 0
    errors: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0
    marked_down: int = 0
    max_in_flight: int = 0
    busy_seconds: float = 0.0
    input_seconds: float = 0.0
    first_sent: float | None = None
    last_answer: float | None = None
    copies: int = 0
    copies_won: int = 0

    def count_error(self, kind: str, count: int = 1) -> None:
        self.errors[kind] = self.errors.get(kind, 0) + count

    def _span(self) -> float | None:
        if self.first_sent is None or self.last_answer is None or self.last_answer <= self.first_sent:
            return None
        return self.last_answer - self.first_sent

    @property
    def busy_share(self) -> float | None:
        """Share of the time from the first request to the last answer with a request in flight."""
        span = self._span()
        return min(1.0, self.busy_seconds / span) if span else None

    def to_json(self) -> dict[str, object]:
        share = self.busy_share
        return {"requests": self.requests, "inputs": self.inputs, "retries": self.retries,
                "errors": dict(sorted(self.errors.items())), "seconds": round(self.seconds, 3),
                "marked_down": self.marked_down, "max_in_flight": self.max_in_flight,
                "mean_inputs_per_request": round(self.inputs / self.requests, 2) if self.requests else None,
                "busy_seconds": round(self.busy_seconds, 3), "copies": self.copies, "copies_won": self.copies_won,
                "mean_in_flight": round(self.input_seconds / span, 1) if (span := self._span()) else None,
                "busy_share": round(share, 4) if share is not None else None}


class Server:
    """One server as the pool sees it: its client, limits, window, what is in flight, and health."""

    def __init__(self, client: TeiClient, limits: ClientLimits, *,
                 latency_factor: float = DEFAULT_LATENCY_FACTOR) -> None:
        self.client = client
        self.limits = limits
        self.window = ConcurrencyWindow(limits.max_inflight_inputs, limits.max_batch_size,
                                        latency_factor=latency_factor)
        self.in_flight = 0
        self.requests_in_flight = 0
        self.healthy = True
        self.lost = False  # taken back by the cloud: never probed, never put back
        self.failures = 0
        self.last_error: TeiError | None = None
        self.payload_limit = limits.payload_limit
        self.batch_cap = limits.max_batch_size
        self.stats = ServerStats()
        self._counted_at: float | None = None

    def __repr__(self) -> str:
        return (f"Server({self.url!r}, in_flight={self.in_flight}, {self.window!r}, "
                f"healthy={self.healthy})")

    @property
    def url(self) -> str:
        return self.client.url

    @property
    def max_requests(self) -> int:
        """Requests in flight at most (see :attr:`ClientLimits.max_requests`)."""
        return self.limits.max_requests

    @property
    def free(self) -> int:
        """Inputs that may be sent now under the window."""
        return self.window.limit - self.in_flight

    @property
    def batch_limit(self) -> int:
        """Inputs in one request at most."""
        return max(1, min(self.batch_cap, self.window.limit))

    def room(self) -> int:
        """Inputs one more request may carry now (0: not now)."""
        if not self.healthy or self.requests_in_flight >= self.max_requests:
            return 0
        return max(0, min(self.free, self.batch_limit))

    def learn_payload_limit(self, refused_size: int) -> None:
        """A body of ``refused_size`` bytes got 413: the real limit is lower than configured."""
        self.payload_limit = min(self.payload_limit, refused_size - 1)

    def learn_batch_cap(self, refused_count: int) -> None:
        """A request of ``refused_count`` inputs was refused as too many."""
        self.batch_cap = max(1, min(self.batch_cap, refused_count // 2))


class EndpointPool:
    """Picks a server for each request and keeps every server's accounting and health.

    Everything runs on one event loop: picking, reserving and releasing never await, so counts
    cannot race. ``listeners`` are called whenever room may have appeared: with ``True`` when a
    request came back (room only), with ``False`` for anything else (a server came back or was added,
    all the work is in).

    ``all_work_in``: set by the caller that knows no more texts will come (a sender, told by the
    driver); from then on, with nothing left to send, idle servers take copies of the requests that
    would land last (``tei/hedging.py``). Left ``None``, nothing is ever copied.
    """

    def __init__(self, servers: list[Server], *, probe_interval: float = DEFAULT_PROBE_INTERVAL_S,
                 down_grace: float = DEFAULT_DOWN_GRACE_S) -> None:
        if not servers:
            raise CapacityUnavailable("no TEI server to send requests to")
        self.servers = servers
        self.probe_interval = probe_interval
        self.down_grace = down_grace
        self.listeners: list[Callable[[bool], None]] = []
        # A one-text request with the run's options: how a server that answered wrongly is re-checked.
        self.probe_request: EmbedRequest | None = None
        self.all_work_in: Callable[[], bool] | None = None
        # Requests on their way, over every caller; one "texts left to send?" question per caller.
        self.flights: set[Flight] = set()
        self.unsent_work: list[Callable[[], bool]] = []
        self._flights_sent = 0
        # Requests whose texts were answered by their twin: they run on until their own answer comes.
        self._outrun: set[asyncio.Task[None]] = set()
        self._probes: set[asyncio.Task[None]] = set()
        self._all_down_since: float | None = None
        self._awaited = 0   # replacements on their way (see expect)
        self._closed = False

    @property
    def max_batch_size(self) -> int:
        """The largest request any server takes (each request also obeys its own server's limit)."""
        return max(s.limits.max_batch_size for s in self.servers)

    @property
    def payload_limit(self) -> int:
        """The largest body any server takes (each request also obeys its own server's limit)."""
        return max(s.limits.payload_limit for s in self.servers)

    @property
    def smallest_payload_limit(self) -> int:
        """A body this size fits every server."""
        return min(s.payload_limit for s in self.servers)

    def pick(self, want: int, avoid: str | None = None) -> Server | None:
        """The healthy server with the most room for a request of up to ``want`` inputs, or None.

        A server qualifies when it has room for a full request (``min(want, its batch limit)``).
        ``avoid`` (a URL) is used only when no other server is healthy: a request that failed there
        is resent on another one.
        """
        healthy = [s for s in self.servers if s.healthy]
        if avoid is not None and any(s.url != avoid for s in healthy):
            healthy = [s for s in healthy if s.url != avoid]
        ready = [s for s in healthy if s.room() >= max(1, min(want, s.batch_limit))]
        return max(ready, key=lambda s: s.free) if ready else None

    def reserve(self, server: Server, count: int) -> None:
        now = time.monotonic()
        self._count_inputs(server, now)
        if server.stats.first_sent is None:
            server.stats.first_sent = now
        server.in_flight += count
        server.requests_in_flight += 1
        server.stats.max_in_flight = max(server.stats.max_in_flight, server.in_flight)

    def release(self, server: Server, count: int) -> None:
        """``count`` inputs came back from ``server``: its room is free for every caller of the pool."""
        now = time.monotonic()
        self._count_inputs(server, now)
        server.in_flight -= count
        server.requests_in_flight -= 1
        server.stats.last_answer = now
        self.wake(room=True)

    @staticmethod
    def _count_inputs(server: Server, now: float) -> None:
        """Add the time since the last change to the busy time (if a request was out) and to the inputs
        in flight times time (for the mean in flight), up to every change: exact whenever stats are read."""
        if server._counted_at is not None:
            elapsed = now - server._counted_at
            server.stats.input_seconds += server.in_flight * elapsed
            if server.requests_in_flight:
                server.stats.busy_seconds += elapsed
        server._counted_at = now

    def wake(self, room: bool = False) -> None:
        """Tell every caller to look again; ``room``: only room came free (a request came back)."""
        for listener in list(self.listeners):
            listener(room)

    def next_order(self) -> int:
        """A number for the next request sent: later requests get higher ones."""
        self._flights_sent += 1
        return self._flights_sent

    def hedge(self) -> bool:
        """Copy the requests that would land last to the servers that would be free first; True if any.

        Only once ``all_work_in`` says so and no caller has a text left to send (see ``tei/hedging.py``).
        """
        # all_work_in first: it is false, and cheap, for all but the last moments of a run.
        if self.all_work_in is None or not self.flights or not self.all_work_in():
            return False
        if any(has_unsent() for has_unsent in self.unsent_work):
            return False
        copied = False
        for flight, server in plan_copies(self.servers, self.flights):
            if flight.copy_to is not None and flight.fits(server):
                flight.copy_to(server)
                copied = True
        return copied

    def outrun(self, task: asyncio.Task[None]) -> None:
        """Keep ``task`` (a request whose twin answered first) until its own answer releases its budget."""
        self._outrun.add(task)
        task.add_done_callback(self._outrun.discard)

    def succeeded(self, server: Server, count: int, *, sent_at: float, now: float, used: bool = True) -> None:
        """``server`` answered ``count`` inputs correctly; ``used``: the answer was the first for its texts.

        An answer that came second (``tei/hedging.py``) counts for the server's health and window, not
        in its requests and inputs: those add up to what the caller got.
        """
        server.failures = 0
        if used:
            server.stats.requests += 1
            server.stats.inputs += count
        server.stats.seconds += now - sent_at
        server.window.on_success(count, now - sent_at, sent_at=sent_at, now=now)

    def overloaded(self, server: Server, *, sent_at: float, now: float) -> None:
        server.window.on_overload(sent_at=sent_at, now=now)

    def failed(self, server: Server, error: TeiError) -> None:
        """A request to ``server`` got no useful answer; enough in a row take the server out."""
        server.failures += 1
        server.last_error = error
        if server.failures >= DOWN_AFTER:
            self.mark_down(server)

    def mark_down(self, server: Server) -> None:
        """Take ``server`` out of rotation and probe it until it answers ``/health`` again."""
        if not server.healthy or self._closed:
            return
        server.healthy = False
        server.stats.marked_down += 1
        task = asyncio.get_running_loop().create_task(self._probe(server))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    def lose(self, url: str) -> bool:
        """The cloud took the server at ``url`` back: take it out for good and call its requests in flight
        back, so that their texts go to the other servers now (see :attr:`Flight.recall`). False when the
        pool has no such server in rotation."""
        server = next((s for s in self.servers if s.url == url and not s.lost), None)
        if server is None:
            return False
        server.lost, server.healthy = True, False
        for recall in [f.recall for f in self.flights if f.server is server and f.recall is not None]:
            recall()
        self.wake()
        return True

    def expect(self) -> None:
        """A replacement server is on its way: no server left is no reason to give up meanwhile."""
        self._awaited += 1

    def unexpect(self) -> None:
        """One of the replacements expected will not come."""
        self._awaited = max(0, self._awaited - 1)

    def add(self, server: Server) -> None:
        """A new server (an expected replacement) joins the rotation."""
        self.servers.append(server)
        self.unexpect()
        self.wake()

    def check_alive(self) -> None:
        """Raise :class:`CapacityUnavailable` once no server has been healthy for ``down_grace`` s
        (and no replacement is expected)."""
        if self._awaited or any(s.healthy for s in self.servers):
            self._all_down_since = None
            return
        now = time.monotonic()
        if self._all_down_since is None:
            self._all_down_since = now
        elif now - self._all_down_since >= self.down_grace:
            faults = "; ".join(f"{s.url}: {_fault(s)}" for s in self.servers)
            raise CapacityUnavailable(
                f"no TEI server gave a correct answer for {self.down_grace:.0f}s ({faults}); "
                "the run stops here and the same command resumes it")

    async def _probe(self, server: Server) -> None:
        while not self._closed:
            await asyncio.sleep(self.probe_interval)
            if server.lost:
                return
            if await self._passes_probe(server):
                server.healthy = True
                server.failures = 0
                server.window.restart()
                self.wake()
                return

    async def _passes_probe(self, server: Server) -> bool:
        """``/health``, then a checked embedding: ``/health`` alone says nothing of ``/embed`` (a proxy's 502
        pages, wrong vectors and hung requests all come with a healthy ``/health``)."""
        if not await server.client.healthy():
            return False
        if self.probe_request is None:
            return True
        try:
            await server.client.embed(self.probe_request)
        except TeiError as exc:
            server.last_error = exc
            return False
        return True

    async def close(self) -> None:
        self._closed = True
        tasks = [*self._probes, *self._outrun]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stats(self) -> dict[str, dict[str, object]]:
        return {s.url: {**s.stats.to_json(), "window": s.window.limit, "window_decreases": s.window.decreases}
                for s in self.servers}


def _fault(server: Server) -> str:
    if server.lost:
        return "taken back by the cloud"
    return str(server.last_error).removeprefix(f"{server.url}: ") if server.last_error else "no answer"
