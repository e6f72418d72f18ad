"""Identical texts in one run (same content hash): each is sent once, its vector written for every id.

Within a shard, the first unit (document, or chunk) with a hash is sent and every later one with the
same hash copies its vector when it comes back (:class:`ShardCopies`).

Across the shards of a run, one :class:`DedupRegistry` actor (on the driver's node, no CPU) holds
each hash a shard has claimed:

* A shard claims its texts' hashes before it sends them, a batch at a time. The first shard to
  claim a hash owns it and sends the text. A shard that finds the hash claimed sends nothing for
  it, marks it *contested*, and takes the vector from the registry *after* it has sent all of its
  own texts. Nobody waits while holding a text others need, so no two shards wait for each other:
  an owner learns which of its hashes are contested in the answers to its claims and takes (a
  take returns early when its caller has vectors to deliver), and publishes those vectors only.
* Only contested vectors travel to the registry while their owner runs. When a shard ends, it
  puts the vectors it owns and did not publish into Ray's object store in one object and hands the
  registry their hashes and the reference (:meth:`DedupRegistry.keep`): a later copy in another
  shard takes its vector from there. The object is owned by the worker process that ran the shard
  (Ray keeps it for later tasks; Ray 2.56 removed handing an object's ownership to an actor): if
  that process exits, the object may be lost, and a later copy of its texts is then sent again. The
  registry reads such an object only when a vector in it is asked for. A corpus with
  no repeats costs the registry a claim and a keep per hash, never a vector; and none of these when
  the run's id index lists the texts another shard holds too (``pipeline/unique_ids.py``): a shard
  then claims only those (``ShardCopies.contested``), and keeps only their vectors.
* An owner that cannot deliver never leaves a waiter stuck: a text the servers refused is
  given up at once (:meth:`DedupRegistry.abandon`), everything a shard still owns is given up
  when it ends (by the shard, and by the driver when its task ends, however it ends), and every
  wait is bounded. A hash given up (or forgotten, below) is sent by each waiter itself. A task
  that Ray retries keeps its claims: the same shard id claims the same hashes again, and is told
  again which of them are contested.
* Bounded memory: at most :data:`DEDUP_MAX_TEXTS` hashes and :data:`DEDUP_KEEP_BYTES` of vectors
  (published, or kept in the object store: an object is freed once every vector in it is
  forgotten); beyond that the oldest vectors are forgotten, and a later copy of such a text is
  sent again. Only the copies sent change: never which rows are written, nor their vectors (a
  copy gets the very vector its text got from the servers).

A registry that dies takes dedup with it (and the objects only it refers to), not the run: every shard then sends what
it has not got a vector for. Each shard holds its own texts' vectors until it ends (its
``shard_docs`` × dimension × 4 bytes at most), and the texts of the copies it waits for.
"""

from __future__ import annotations

import asyncio
import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from teibatch.pipeline.ramp import growing_sizes
from teibatch.sparse import Vector, stack_rows

DEDUP_MAX_TEXTS = 2_000_000
DEDUP_KEEP_BYTES = 256 * 1024 * 1024
# Hashes a shard claims in one call: its texts are read this far ahead of sending. A shard's first
# claim is CLAIM_BATCH hashes, and each next one CLAIM_GROWTH times the one before, up to
# MAX_CLAIM_BATCH: the first texts go out soon, and a large shard makes few calls (each one a Ray
# round trip, milliseconds of CPU).
CLAIM_BATCH = 512
CLAIM_GROWTH = 4
MAX_CLAIM_BATCH = 8192
# How long a shard waits for the vectors other shards send for it, in request timeouts (plus a
# margin): by then their requests have failed or timed out, and the shard sends the texts itself.
WAIT_TIMEOUTS = 4
WAIT_MARGIN_S = 30.0


def claim_sizes() -> Iterator[int]:
    """How many hashes each of a shard's claims holds, in turn: :data:`CLAIM_BATCH`, then each
    :data:`CLAIM_GROWTH` times the one before, up to :data:`MAX_CLAIM_BATCH`."""
    return growing_sizes(CLAIM_BATCH, CLAIM_GROWTH, MAX_CLAIM_BATCH)


def hash_key(content_hash: str) -> bytes:
    """The registry's key of a content hash (its 16 bytes)."""
    return bytes.fromhex(content_hash)


@dataclass(slots=True)
class _Kept:
    """Vectors a shard left in the object store when it ended: the reference, and the rows once read."""

    ref: Any  # ray.ObjectRef of (vectors, truncated), owned by the shard's worker process
    rows: tuple[np.ndarray, np.ndarray] | None = None


@dataclass(slots=True)
class _Entry:
    owner: str
    vector: Vector | None = None
    truncated: bool = False
    contested: bool = False  # another shard waits for it: its owner publishes it
    kept: _Kept | None = None  # or it is row ``row`` of an object its owner left
    row: int = 0
    nbytes: int = 0

    @property
    def ready(self) -> bool:
        """Whether its vector is here (published, or kept in the object store)."""
        return self.vector is not None or self.kept is not None


@dataclass(frozen=True)
class Claimed:
    """What :meth:`DedupRegistry.claim` answers: per key whether the caller sends it, and the keys
    (``deliver``) the caller owns that others wait for: it publishes their vectors."""

    mine: list[bool]
    deliver: list[bytes]


@dataclass(frozen=True)
class Taken:
    """What :meth:`DedupRegistry.take` found: the vectors at ``found``'s positions, the positions
    (``gone``) of texts no shard will send for the caller: it sends them itself, and the keys
    (``deliver``) the caller owns that others wait for."""

    found: list[int]
    vectors: np.ndarray
    truncated: list[bool]
    gone: list[int]
    deliver: list[bytes] = field(default_factory=list)


class DedupRegistry:
    """The run's content hashes: who sends each one, and its vector once it is asked for. Methods run
    on one event loop (a Ray asyncio actor), so each runs whole between two others (up to an ``await``)."""

    def __init__(self, max_texts: int = DEDUP_MAX_TEXTS, keep_bytes: int = DEDUP_KEEP_BYTES) -> None:
        self._max_texts, self._keep_bytes = max_texts, keep_bytes
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._owned: dict[str, set[bytes]] = {}  # per shard, what it owns and has not published
        self._asked: dict[str, set[bytes]] = {}  # per shard, what it owns that others wait for, not told yet
        self._bytes = 0
        self._published = self._read = 0  # bytes of vectors received, objects read: what repeats cost
        self._changed = asyncio.Event()

    async def claim(self, shard: str, keys: list[bytes]) -> Claimed:
        """For each key: ``True`` when ``shard`` sends it (first to claim it, or claimed by it before),
        ``False`` when another shard does or did (take its vector with :meth:`take`); and what
        ``shard`` is to deliver."""
        mine, contested = [], False
        deliver: set[bytes] = set()
        for key in keys:
            entry = self._entries.get(key)
            if entry is None:
                self._entries[key] = _Entry(shard)
                self._owned.setdefault(shard, set()).add(key)
                mine.append(True)
            elif entry.owner == shard and not entry.ready:
                mine.append(True)
                if entry.contested:  # a task run again is told again
                    deliver.add(key)
            else:
                mine.append(False)
                if not entry.ready and not entry.contested:
                    entry.contested = contested = True
                    self._asked.setdefault(entry.owner, set()).add(key)
        deliver.update(self._asked.pop(shard, ()))
        self._forget_oldest()
        if contested:
            self._wake()  # an owner waiting in :meth:`take` has something to deliver
        return Claimed(mine, list(deliver))

    async def publish(self, shard: str, keys: list[bytes], vectors: np.ndarray, truncated: list[bool]) -> None:
        """The vectors of contested texts ``shard`` sent, back from the servers."""
        for key, vector, cut in zip(keys, vectors, truncated, strict=True):
            entry = self._entries.get(key)
            if entry is None or entry.ready:
                continue
            self._owned.get(entry.owner, set()).discard(key)
            entry.vector, entry.truncated = vector.copy(), bool(cut)
            entry.nbytes = entry.vector.nbytes
            self._bytes += entry.nbytes
            self._published += entry.nbytes
        self._forget_oldest()
        self._wake()

    async def keep(self, shard: str, keys: bytes, kept: list[Any], nbytes: int) -> None:
        """``shard`` ends and leaves the vectors of ``keys`` (16 bytes each, in the order of the object's
        rows) in the object store: ``kept``'s one reference, ``nbytes`` in all; nothing is read now. What
        it owns beyond them is given up (:meth:`release`), in this same call: Ray does not keep an async
        actor's calls in order, and a release run first would give up the kept vectors too."""
        rows = len(keys) // 16
        if rows:
            held, each = _Kept(kept[0]), nbytes // rows
            owned = self._owned.get(shard, set())
            for row in range(rows):
                key = keys[16 * row:16 * (row + 1)]
                entry = self._entries.get(key)
                if entry is None or entry.ready or entry.owner != shard:
                    continue
                owned.discard(key)
                entry.kept, entry.row, entry.nbytes = held, row, each
                self._bytes += each
            self._forget_oldest()
        await self.release([shard])

    async def abandon(self, shard: str, keys: list[bytes]) -> None:
        """``shard`` will not publish ``keys`` (the servers refused those texts): their waiters send them."""
        owned = self._owned.get(shard, set())
        for key in keys:
            entry = self._entries.get(key)
            if entry is not None and not entry.ready and entry.owner == shard:
                del self._entries[key]
                owned.discard(key)
        self._wake()

    async def release(self, shards: list[str]) -> None:
        """``shards`` have ended (or their task has): what they own and did not publish is given up."""
        for shard in shards:
            self._asked.pop(shard, None)
            for key in self._owned.pop(shard, set()):
                entry = self._entries.get(key)
                if entry is not None and not entry.ready and entry.owner == shard:
                    del self._entries[key]
        self._wake()

    async def take(self, shard: str, keys: list[bytes], timeout: float) -> Taken:
        """The vectors of ``keys`` that other shards send, waiting at most ``timeout`` seconds for the
        ones still on their way, and no longer than until ``shard`` has vectors to deliver; what is
        still on its way then is neither found nor gone."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            changed = self._changed
            found, gone, waiting = [], [], False
            for position, key in enumerate(keys):
                entry = self._entries.get(key)
                if entry is None:
                    gone.append(position)
                elif entry.ready:
                    found.append((position, entry))
                else:
                    waiting = True
            left = deadline - loop.time()
            if not waiting or left <= 0 or self._asked.get(shard):
                break
            try:
                await asyncio.wait_for(changed.wait(), left)
            except TimeoutError:
                continue  # one last look
        deliver = list(self._asked.pop(shard, ()))
        positions, vectors, truncated = [], [], []
        for position, entry in found:  # entries found stay valid even if forgotten while an object is read
            got = await self._vector(entry)
            if got is None:  # its object is lost: forgotten, and sent by each waiter
                gone.append(position)
                if self._entries.get(keys[position]) is entry:
                    del self._entries[keys[position]]
                    self._bytes -= entry.nbytes
            else:
                positions.append(position)
                vectors.append(got[0])
                truncated.append(got[1])
        return Taken(positions, stack_rows(vectors), truncated, sorted(gone), deliver)

    def stats(self) -> dict[str, int]:
        """Hashes held, bytes of vectors held (here or in the object store), bytes of vectors published
        to it so far, and objects it has read."""
        return {"texts": len(self._entries), "vector_bytes": self._bytes, "published_bytes": self._published,
                "objects_read": self._read}

    async def _vector(self, entry: _Entry) -> tuple[Vector, bool] | None:
        """A ready entry's vector and truncated flag, reading its owner's object the first time one is
        asked for; ``None`` if that object cannot be read (the waiter sends the text itself)."""
        if entry.vector is not None or entry.kept is None:
            return entry.vector, entry.truncated  # type: ignore[return-value]
        kept = entry.kept
        if kept.rows is None:
            try:
                kept.rows = await kept.ref
            except ray.exceptions.RayError:
                return None
            self._read += 1
        vectors, truncated = kept.rows
        return vectors[entry.row], bool(truncated[entry.row])

    def _wake(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _forget_oldest(self) -> None:
        """Forget the oldest vectors while over either bound (hashes whose vector is not here are kept:
        they are few, as many as the running shards own)."""
        for _ in range(len(self._entries)):
            if len(self._entries) <= self._max_texts and self._bytes <= self._keep_bytes:
                return
            key, entry = self._entries.popitem(last=False)
            if not entry.ready:
                self._entries[key] = entry  # on its way: to the back
            else:
                self._bytes -= entry.nbytes


@dataclass(frozen=True)
class Dedup:
    """Deduplication as shard tasks see it: the registry actor, and how long a shard waits for copies.

    Without a registry (:meth:`within_shards`) each shard sends a text it holds twice once, and asks
    nobody about the others.
    """

    registry: Any  # ray.actor.ActorHandle of DedupRegistry; None: no text is in two shards
    wait_s: float

    @classmethod
    def within_shards(cls) -> Dedup:
        """Deduplication with no registry: the run's id index read every text and found none that two
        shards hold (a registry process would cost a second of CPU and never be asked)."""
        return cls(None, 0.0)

    @classmethod
    def for_run(cls, request_timeout: float) -> Dedup:
        """The run's registry actor, on this (the driver's) node when it can; not restarted if it dies."""
        here = ray.get_runtime_context().get_node_id()
        actor_class = ray.remote(DedupRegistry).options(  # type: ignore[arg-type]
            num_cpus=0, max_restarts=0, max_concurrency=1000,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=True))
        return cls(actor_class.remote(), WAIT_TIMEOUTS * request_timeout + WAIT_MARGIN_S)

    def release(self, shards: Iterable[str]) -> None:
        """The task of ``shards`` has ended: give up what they still own (it does not wait)."""
        if self.registry is not None:
            self.registry.release.remote(list(shards))


@dataclass
class ShardCopies:
    """One shard's side of deduplication: which of its units it sends, which copy another unit's
    vector (:attr:`copies`, ready for its rows), and which still wait.

    ``dedup`` ``None``: only copies within the shard. A registry that fails stops being asked.
    """

    shard: str
    hashes: list[str]  # per unit (``Units.hashes``)
    dedup: Dedup | None = None
    contested: set[int] | None = None
    """The units whose text another shard holds too (known from the run's id index, filled as the shard
    is read): only they are claimed in the registry, the others are this shard's without asking.
    ``None``: not known, every unit is claimed."""
    copies: dict[int, tuple[str, Vector, bool]] = field(default_factory=dict)
    late: dict[int, tuple[str, Vector, bool]] = field(default_factory=dict)
    """Units another shard was to send, sent by this one after all (:meth:`wait`): not copies."""
    refused: dict[int, int] = field(default_factory=dict)
    """Copies whose text the servers refused for good when this shard sent it: copy → the unit sent."""
    _first: dict[str, int] = field(default_factory=dict)  # hash → its first unit (sent here or by another shard)
    _source: dict[int, int] = field(default_factory=dict)  # copy not final yet → its hash's first unit
    _foreign: dict[int, str] = field(default_factory=dict)  # first unit another shard sends → its text
    _landed: dict[int, tuple[np.ndarray, bool]] = field(default_factory=dict)  # first units' vectors
    _refused_firsts: set[int] = field(default_factory=set)
    _mine: dict[bytes, int] = field(default_factory=dict)  # registry key → unit this shard owns (sends)
    _deliver: set[int] = field(default_factory=set)  # units it owns that others wait for, not back yet
    _published: set[int] = field(default_factory=set)
    _waiting: list[int] = field(default_factory=list)  # heap of units that may not be final yet

    def __post_init__(self) -> None:
        if self.dedup is not None and self.dedup.registry is None:
            self.dedup = None  # nothing to ask: copies within the shard only

    def decide(self, batch: Sequence[tuple[int, str]]) -> Iterator[tuple[int, str]]:
        """The units of ``batch`` (``(unit, text)``, in order) that this shard sends; the others are
        copies of a unit before them, or of one that another shard sends."""
        firsts: list[tuple[int, str]] = []
        first_of, hashes = self._first.setdefault, self.hashes
        for unit, text in batch:
            first = first_of(hashes[unit], unit)
            if first == unit:
                firsts.append((unit, text))
            elif not self._settle(unit, first):
                self._source[unit] = first
                heapq.heappush(self._waiting, unit)
        if self.contested is not None and self.contested.isdisjoint([u for u, _ in firsts]):
            yield from firsts  # no other shard holds these texts: this shard's without asking
            return
        for (unit, text), own in zip(firsts, self._claim([u for u, _ in firsts]), strict=True):
            if own:
                yield unit, text
            else:
                self._foreign[unit] = text
                heapq.heappush(self._waiting, unit)

    def landed(self, units: Sequence[int], vectors: np.ndarray, ok: np.ndarray, truncated: np.ndarray,
               refused: Iterable[int] = (), *, publish: bool = True) -> None:
        """The servers' answers for ``units``, sent by this shard (``refused``: those refused for good):
        their copies become final, and the registry gets the vectors others wait for (``publish``) or
        gives the refused texts up (their waiters send them)."""
        # Every answered unit's vector is kept (a copy of its text may still be read in this shard):
        # one pass over plain lists, a shard holds millions of units.
        landed = self._landed
        sent = [unit for unit, good in zip(units, ok.tolist(), strict=True) if good]
        if len(sent) == len(units):
            landed.update(zip(units, zip(vectors, truncated.tolist(), strict=True), strict=True))
        else:
            landed.update((unit, (row, cut)) for unit, good, row, cut in
                          zip(units, ok.tolist(), vectors, truncated.tolist(), strict=True) if good)
        if self._foreign:
            for unit in sent:
                if self._foreign.pop(unit, None) is not None:
                    self.late[unit] = (self.hashes[unit], *landed[unit])
        refused = list(refused)
        self._refused_firsts.update(refused)
        for unit in refused:
            self._foreign.pop(unit, None)
        if publish and self._deliver:
            self._publish([unit for unit in sent if unit in self._deliver])
        if publish and refused:
            self._call(lambda r: r.abandon.remote(self.shard, [hash_key(self.hashes[u]) for u in refused]))
        self._resolve()

    def final_through(self, unit: int) -> bool:
        """Whether every copy and foreign unit up to ``unit`` is final (its rows can be handed over)."""
        while self._waiting and self._is_final(self._waiting[0]):
            heapq.heappop(self._waiting)
        return not self._waiting or self._waiting[0] > unit

    @property
    def waiting(self) -> bool:
        """Whether some of this shard's units wait for the vector of a text another shard sends."""
        return bool(self._foreign)

    def peek(self) -> None:
        """Take, without waiting, the vectors other shards have published for this one so far."""
        self._take(0.0)

    def wait(self) -> list[tuple[int, str]]:
        """Take the vectors other shards send for this one (waiting at most ``wait_s``); return the
        units (and texts) nobody will send for it: this shard sends them itself, then calls
        :meth:`landed` with them (``publish=False``)."""
        deadline = time.monotonic() + (self.dedup.wait_s if self.dedup is not None else 0.0)
        while self._take(max(0.0, deadline - time.monotonic())) and time.monotonic() < deadline:
            pass  # it was asked for vectors and delivered them: wait on
        return list(self._foreign.items())

    def release(self) -> None:
        """This shard ends: the vectors it owns and did not publish go to the object store, for copies in
        shards still to come, and the rest it owns is given up (its waiters send it)."""
        kept = [unit for unit in self._mine.values() if unit in self._landed and unit not in self._published]
        if not kept:
            self._call(lambda r: r.release.remote([self.shard]))
            return
        vectors = [self._landed[unit][0] for unit in kept]
        try:
            ref = ray.put((stack_rows(vectors), np.array([self._landed[unit][1] for unit in kept], dtype=bool)))
        except ray.exceptions.RayError:  # no room in the object store: give it all up (later copies are sent)
            self._call(lambda r: r.release.remote([self.shard]))
            return
        # Waited for: the driver's release of this shard, once its task has ended, must not come first.
        self._call(lambda r: ray.get(r.keep.remote(self.shard, b"".join(hash_key(self.hashes[u]) for u in kept),
                                                   [ref], sum(v.nbytes for v in vectors))))

    def _is_final(self, unit: int) -> bool:
        return unit in self.copies or unit in self.refused or unit in self._landed or unit in self._refused_firsts

    def _resolve(self) -> None:
        """Copies whose first unit has its vector now (or was refused) are final."""
        for unit, first in list(self._source.items()):
            if self._settle(unit, first):
                del self._source[unit]
        for unit in [u for u in self._foreign if u in self._landed]:
            del self._foreign[unit]

    def _settle(self, unit: int, first: int) -> bool:
        """Make copy ``unit`` final if its hash's first unit has its vector or was refused; whether it is final."""
        if first in self._landed:
            self.copies[unit] = (self.hashes[unit], *self._landed[first])
        elif first in self._refused_firsts:
            self.refused[unit] = first
        else:
            return False
        return True

    def _take(self, timeout: float) -> bool:
        """Take what other shards sent for this one (waiting at most ``timeout``); whether the registry
        stopped the wait early, asking this shard for vectors (delivered now)."""
        if not self._foreign or self.dedup is None:
            return False
        units = list(self._foreign)
        taken: Taken | None = self._call(lambda r: ray.get(r.take.remote(
            self.shard, [hash_key(self.hashes[u]) for u in units], timeout)))
        if taken is None:  # no registry any more: this shard sends them all itself
            return False
        for row, position in enumerate(taken.found):
            unit = units[position]
            self._landed[unit] = (taken.vectors[row], taken.truncated[row])
            self.copies[unit] = (self.hashes[unit], *self._landed[unit])
        self._resolve()
        self._asked_for(taken.deliver)
        return bool(taken.deliver)

    def _claim(self, units: list[int]) -> list[bool]:
        """Whether this shard sends each of ``units`` (the first of their hash in it): the registry says
        for those another shard may hold too; every other one is this shard's."""
        if self.contested is not None:
            contested = [u for u in units if u in self.contested]
            mine = dict(zip(contested, self._ask(contested), strict=True))
            return [mine.get(u, True) for u in units]
        return self._ask(units)

    def _ask(self, units: list[int]) -> list[bool]:
        if not units or self.dedup is None:
            return [True] * len(units)
        keys = [hash_key(self.hashes[u]) for u in units]
        claimed: Claimed | None = self._call(lambda r: ray.get(r.claim.remote(self.shard, keys)))
        if claimed is None:
            return [True] * len(units)
        self._mine.update((key, unit) for key, unit, mine in zip(keys, units, claimed.mine, strict=True) if mine)
        self._asked_for(claimed.deliver)
        return claimed.mine

    def _asked_for(self, keys: list[bytes]) -> None:
        """Other shards wait for the vectors of ``keys`` (this shard's): publish those back already,
        the others once they are."""
        units = {self._mine[key] for key in keys if key in self._mine} - self._published
        self._deliver.update(units - self._landed.keys())
        self._publish([unit for unit in units if unit in self._landed])

    def _publish(self, units: list[int]) -> None:
        """Hand the registry the vectors of ``units`` (this shard's, back from the servers) for their waiters."""
        if not units:
            return
        self._deliver.difference_update(units)
        self._published.update(units)
        vectors = stack_rows([self._landed[unit][0] for unit in units])
        self._call(lambda r: r.publish.remote(self.shard, [hash_key(self.hashes[u]) for u in units], vectors,
                                              [self._landed[unit][1] for unit in units]))

    def _call(self, call: Callable[[Any], Any]) -> Any:
        """``call`` on the registry; ``None`` (and no registry from now on) if it is gone."""
        if self.dedup is None:
            return None
        try:
            return call(self.dedup.registry)
        except ray.exceptions.RayError:
            self.dedup = None
            return None
