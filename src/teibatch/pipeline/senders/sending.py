"""The shard task's side of the senders: its texts streamed out in chunks, the results back in text order.

Also the notices that tell the senders when no more texts will come (which allows tail hedging,
``tei/hedging.py``): the driver names the last shards, and each shard says when it has sent its last
chunk.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import islice

import ray

from teibatch.errors import CapacityUnavailable, SenderFailed
from teibatch.pipeline.admission import Once
from teibatch.pipeline.ramp import growing_sizes
from teibatch.pipeline.senders.plans import CHUNK_GROWTH, SenderRef, least_loaded
from teibatch.tei import EmbedResult

# A task keeps this many of a sender's budgets outstanding there (plus a chunk): enough queued in the
# sender that a server never waits for a task to be scheduled, even on a busy machine.
OUTSTANDING_BUDGETS = 2
# A chunk whose sender died goes again after a wait that doubles each time, up to this many times: while
# Ray restarts the sender (seconds on a busy machine) every call to it fails at once, so resending at
# once would spend the resends on one restart.
MAX_CHUNK_RESENDS = 5
FIRST_RESEND_WAIT_S = 0.5
MAX_RESEND_WAIT_S = 8.0
# How long a shard task waits for one chunk before it asks again whether its sender still lives.
WAIT_SLICE_S = 5.0


def last_streams(senders: Sequence[SenderRef], streams: Iterable[str]) -> None:
    """Tell every sender that only the shards ``streams`` may still send texts (it does not wait)."""
    names = sorted(streams)
    for sender in senders:
        sender.actor.last_streams.remote(names)


def streams_done(senders: Sequence[SenderRef], streams: Iterable[str]) -> None:
    """Tell every sender that the shards ``streams`` will send nothing more (it does not wait)."""
    for stream in streams:
        for sender in senders:
            sender.actor.stream_done.remote(stream)


def embed_through_senders(texts: Iterable[str], senders: Sequence[SenderRef], dimension: int,
                          priority: float = 0.0, stream: str | None = None) -> EmbedResult:
    """Embed ``texts`` through ``senders`` and put the results together in order: :func:`embedded_in_order`, merged."""
    parts = list(embedded_in_order(texts, senders, priority=priority, stream=stream))
    return EmbedResult.assembled(sum(len(part.ok) for _, part in parts), dimension, parts)


def embedded_in_order(texts: Iterable[str], senders: Sequence[SenderRef], priority: float = 0.0,
                      stream: str | None = None) -> Iterator[tuple[int, EmbedResult]]:
    """Embed ``texts`` in chunks over ``senders``; yield ``(start, result)`` per chunk, in text order (in a shard task).

    A chunk's result is yielded as soon as it and every chunk before it are back, so that the caller
    can write the leading vectors while the rest are embedded.

    ``texts`` is read lazily, one chunk at a time, only when a sender has room for it: the first chunk
    (a few full requests) goes out as soon as it is read, while the rest of the shard is still being
    read and hashed; each next chunk is ``CHUNK_GROWTH`` times larger, up to the senders' chunk size.

    ``priority`` orders this task's chunks against other tasks' in each sender (lower first): the
    task's start time, so that the oldest task finishes first (see ``pipeline/admission.py``).

    Each sender gets at most twice its budget plus one chunk of this task's texts at a time, so that
    this task alone can keep every server full while the others read or write; new chunks go to the sender
    with the fewest of this task's inputs outstanding per input of its budget (:func:`least_loaded`),
    so a faster sender gets more. A sender whose
    servers are all down (``CapacityUnavailable``) is left for this task while another sender lives.

    ``stream``: the shard's id, told to every sender once its last chunk is out (see ``Streams`` in ``core.py``).
    """
    all_sent = Once(lambda: streams_done(senders, [stream] if stream is not None else []))
    try:
        yield from _send_in_chunks(texts, senders, priority, all_sent)
    finally:
        all_sent()  # a shard that failed sends nothing more either


def _send_in_chunks(texts: Iterable[str], senders: Sequence[SenderRef], priority: float,
                    all_sent: Callable[[], None]) -> Iterator[tuple[int, EmbedResult]]:
    """The work of :func:`embedded_in_order`; ``all_sent`` is called once the last chunk is out."""
    sizes = growing_sizes(min(s.first_chunk_size for s in senders), CHUNK_GROWTH, min(s.chunk_size for s in senders))
    chunk_size = next(sizes)
    source = iter(texts)
    count = 0  # texts read from ``source`` so far
    unsent: deque[tuple[int, list[str]]] = deque()  # chunks read, or to be sent again
    outstanding: dict[ray.ObjectRef, tuple[int, list[str], int]] = {}
    load = [0] * len(senders)
    alive = set(range(len(senders)))
    resends: dict[int, int] = {}
    back: dict[int, EmbedResult] = {}  # results that wait for an earlier chunk's
    given = 0  # texts whose results were yielded
    exhausted = False
    while True:
        while ready := [i for i in alive if load[i] < OUTSTANDING_BUDGETS * senders[i].budget + senders[i].chunk_size]:
            if not unsent and not exhausted:
                chunk = list(islice(source, chunk_size))
                exhausted = len(chunk) < chunk_size
                chunk_size = next(sizes)
                if chunk:
                    unsent.append((count, chunk))
                    count += len(chunk)
            if not unsent:
                break
            index = least_loaded(senders, load, ready)
            start, chunk = unsent.popleft()
            outstanding[senders[index].actor.embed.remote(chunk, priority, senders[index].plan)] = (start, chunk, index)
            load[index] += len(chunk)
        if exhausted and not unsent:
            all_sent()
        if not outstanding:
            break
        done, _ = ray.wait(list(outstanding), num_returns=1, timeout=WAIT_SLICE_S)
        for ref in done:
            start, chunk, index = outstanding.pop(ref)
            load[index] -= len(chunk)
            try:
                result: EmbedResult = ray.get(ref)
            except ray.exceptions.RayTaskError as exc:
                cause = getattr(exc, "cause", None)
                if isinstance(cause, CapacityUnavailable) and len(alive) > 1:
                    alive.discard(index)
                    unsent.appendleft((start, chunk))
                    continue
                raise (cause if isinstance(cause, BaseException) else exc) from None
            except ray.exceptions.RayActorError as exc:
                resends[start] = resends.get(start, 0) + 1
                if resends[start] > MAX_CHUNK_RESENDS:
                    raise SenderFailed(f"a sender failed {MAX_CHUNK_RESENDS + 1} times in a row on texts "
                                       f"{start}-{start + len(chunk)} of this shard ({exc.__class__.__name__}), "
                                       "Ray's restarts of it included; the same command retries the shard") from None
                time.sleep(min(FIRST_RESEND_WAIT_S * 2 ** (resends[start] - 1), MAX_RESEND_WAIT_S))
                unsent.appendleft((start, chunk))
                continue
            back[start] = result
            while given in back:
                result = back.pop(given)
                yield given, result
                given += len(result.ok)
