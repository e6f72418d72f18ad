"""Tail hedging: once all the work is out, idle servers take copies of the requests that would land last.

At the end of a run every server drains the requests it holds, and they do not finish together:
TEI batches up to ``max_batch_tokens`` at a time, texts differ in length, one GPU may be slower.
The client waits for the last server while the others sit idle. Once the caller says that no more
work is coming (``EndpointPool.all_work_in``) and no text waits to be sent, a server with nothing in
flight takes copies of the requests that would land last elsewhere, as many as would come back
before their originals. The first answer wins; the other one is dropped when it comes.

What a copy never breaks, and what it costs:

* a copy is counted in its own server's in-flight budget and window like any request, until its
  answer comes back; the original is never cancelled (a cancelled request still sits in the server's
  queue while the client would count it as gone), so ``max_concurrent_requests`` holds on both;
* a copy is made only of an original, at most once, and only when it fits the other server's batch
  and payload limits;
* it costs only time of servers that would otherwise wait: nothing is copied while any text waits,
  and only to a server with nothing in flight. TEI puts every request it holds into its next batch
  (up to ``max_batch_tokens``), so a copy sent to a server that still has requests of its own would
  join their batch and make them later; a copy that loses on an idle server took nothing from anyone.

The estimate counts characters and takes every server as equally fast: a request lands after the
characters sent to its server before it, and after its own; the copies sent to one idle server
together form one batch and come back together, after all of their characters.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from teibatch.tei.client import EmbedRequest
    from teibatch.tei.pool import Server


@dataclass(eq=False)
class Flight:
    """One request on its way to ``server``; ``twin`` is its copy (or, for a copy, its original)."""

    server: Server
    request: EmbedRequest
    order: int
    copy_to: Callable[[Server], None] | None = None
    # Calls the request back because its server is gone (EndpointPool.lose): its texts go to another server.
    recall: Callable[[], None] | None = None
    twin: Flight | None = None
    is_copy: bool = False
    answered: bool = False
    landed: bool = False

    @property
    def settled(self) -> bool:
        """The texts have their vectors, from this request or from its twin."""
        return self.answered or (self.twin is not None and self.twin.answered)

    @property
    def twin_out(self) -> bool:
        """The twin is still on its way (and may yet answer for the texts)."""
        return self.twin is not None and not self.twin.landed

    def fits(self, server: Server) -> bool:
        """``server`` may take a copy of this request as it is (batch and payload limits, room now)."""
        count = self.request.count
        return (server.healthy and server is not self.server and count <= server.batch_limit
                and len(self.request.body) <= server.payload_limit and server.room() >= count)


def plan_copies(servers: Sequence[Server], flights: Collection[Flight]) -> list[tuple[Flight, Server]]:
    """Which requests to copy where: the ones that would land last go to servers with nothing in flight,
    as long as the copies sent to one server, answered together, would be back before the original."""
    queued = {id(server): 0 for server in servers}
    ahead: dict[int, int] = {}
    for flight in sorted(flights, key=lambda f: f.order):
        ahead[id(flight)] = queued.get(id(flight.server), 0)
        queued[id(flight.server)] = ahead[id(flight)] + flight.request.chars
    idle = [s for s in servers if queued[id(s)] == 0 and s.requests_in_flight == 0]
    candidates = [f for f in flights if f.copy_to is not None and f.twin is None and not f.is_copy and not f.landed]
    candidates.sort(key=lambda f: ahead[id(f)] + f.request.chars, reverse=True)
    copies: list[tuple[Flight, Server]] = []
    for flight in candidates:
        targets = [s for s in idle if flight.fits(s)]
        if not targets:
            continue
        target = min(targets, key=lambda s: queued[id(s)])
        # The copies to one server come back together, after all of their characters; candidates come
        # latest first, so this copy's original is the earliest of them to land.
        if queued[id(target)] >= ahead[id(flight)]:
            continue
        copies.append((flight, target))
        queued[id(target)] += flight.request.chars
    return copies
