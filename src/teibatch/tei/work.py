"""What is left to send: fresh texts, packed per server at send time, and units to resend.

A fresh text is encoded once, checked against what the servers would refuse for size, and packed
with its neighbours into a request sized for the server that will carry it (its batch limit, its
free window, its payload limit). A request that fails comes back as a :class:`Unit`: its texts stay
together (never merged with others, so bisection converges), may be cut into smaller requests to
fit a server, and carry their retry count, the server to avoid and the time before which they wait.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import orjson

from teibatch.tei.packing import ON_TOO_LONG_TRUNCATE, RequestPacker

FAILURE_EMPTY = "empty_text"
FAILURE_INVALID = "invalid_text"
FAILURE_TOO_LONG = "input_too_long"
FAILURE_PAYLOAD = "payload_too_large"
FAILURE_REFUSED = "request_refused"
FAILURE_EMBED = "embed_failed"
# Failures caused by the servers, not by the text: the same text may succeed later, so they are
# never final rejects (a shard holding one is not committed; the next run sends the text again).
RETRYABLE_FAILURES = frozenset({FAILURE_EMBED})


@dataclass(frozen=True)
class Failure:
    """The text at ``position`` could not be embedded; ``reason`` is a short code, ``detail`` why."""

    position: int
    reason: str
    detail: str


@dataclass(eq=False, slots=True)
class Item:
    """One text ready to send: its position in the caller's list and its encoded JSON string."""

    position: int
    encoded: bytes
    chars: int
    truncated: bool = False


@dataclass(eq=False)
class Unit:
    """Texts that travel together after a failure (or alone, to be truncated by the server)."""

    items: list[Item]
    attempts: int = 0
    overloads: int = 0
    avoid: str | None = None
    due: float = 0.0
    truncating: bool = False


@dataclass
class WorkQueue:
    """Fresh positions not yet read, units waiting to be resent, and failures so far."""

    texts: Sequence[str]
    packer: RequestPacker
    payload_limit: int
    max_input_chars: int | None = None
    units: deque[Unit] = field(default_factory=deque)
    failures: list[Failure] = field(default_factory=list)
    _next: int = 0
    _held: Item | None = None

    @property
    def fresh_left(self) -> int:
        return len(self.texts) - self._next + (self._held is not None)

    def empty(self) -> bool:
        return not self.fresh_left and not self.units

    def candidates(self, now: float) -> Iterator[Unit | None]:
        """What may be sent now, first first: due units, then ``None`` for fresh texts."""
        for unit in list(self.units):
            if unit.due <= now:
                yield unit
        if self.fresh_left:
            yield None

    def next_due(self) -> float | None:
        """When the first waiting unit becomes due (loop time), or None."""
        return min((u.due for u in self.units), default=None)

    def fail(self, items: Sequence[Item], reason: str, detail: str) -> None:
        self.failures.extend(Failure(i.position, reason, detail) for i in items)

    def put(self, unit: Unit, *, first: bool = False) -> None:
        if first:
            self.units.appendleft(unit)
        else:
            self.units.append(unit)

    def packer_for(self, unit: Unit | None) -> RequestPacker:
        return self.packer.truncating() if unit is not None and unit.truncating else self.packer

    def take(self, unit: Unit | None, room: int, payload_limit: int) -> list[Item]:
        """Up to ``room`` items from ``unit`` (or fresh texts) whose body fits ``payload_limit``."""
        packer = self.packer_for(unit)
        size, taken = packer.overhead, list[Item]()
        if unit is None and self._held is None:
            size = self._take_plain(taken, room, size, payload_limit)
        while len(taken) < room:
            item = self._peek(unit)
            if item is None:
                break
            extra = len(item.encoded) + (1 if taken else 0)
            if size + extra > payload_limit:
                if taken:
                    break
                # Too big even alone: cut it in place (then it fits), or it leaves the queue.
                self._shrink(unit, item, packer, payload_limit)
                continue
            self._pop(unit)
            taken.append(item)
            size += extra
        if unit is not None and not unit.items and unit in self.units:
            self.units.remove(unit)
        return taken

    def _take_plain(self, taken: list[Item], room: int, size: int, payload_limit: int) -> int:
        """Fresh texts into ``taken`` (a body of ``size`` bytes so far) while each is plain: not empty,
        JSON-encodable, short enough and small enough alone (what :meth:`_prepare` lets through as it is),
        and fitting the body. Gives the body's size; the first text it stops at is left for :meth:`take`'s
        own loop, encoded and held if it was only too big for this body.

        Every request of a run starts here: one pass, no call per text.
        """
        texts, limit_alone = self.texts, self.payload_limit - self.packer.overhead
        max_chars = None if self.packer.options.truncate else self.max_input_chars
        dumps, end = orjson.dumps, len(texts)
        while len(taken) < room and self._next < end:
            text = texts[self._next]
            if not text or (max_chars is not None and len(text) > max_chars):
                break
            try:
                encoded = dumps(text)
            except orjson.JSONEncodeError:
                break
            if len(encoded) > limit_alone:
                break
            item = Item(self._next, encoded, len(text))
            self._next += 1
            extra = len(encoded) + (1 if taken else 0)
            if size + extra > payload_limit:
                self._held = item
                break
            taken.append(item)
            size += extra
        return size

    def _peek(self, unit: Unit | None) -> Item | None:
        if unit is not None:
            return unit.items[0] if unit.items else None
        while self._held is None and self._next < len(self.texts):
            self._held = self._prepare(self._next)
            self._next += 1
        return self._held

    def _pop(self, unit: Unit | None) -> None:
        if unit is not None:
            unit.items.pop(0)
        else:
            self._held = None

    def _prepare(self, position: int) -> Item | None:
        """A fresh text as an item, or None when it is failed or set aside to be sent on its own."""
        text = self.texts[position]
        if not text:
            self.failures.append(Failure(position, FAILURE_EMPTY, "the text is empty; TEI refuses empty inputs"))
            return None
        try:
            encoded = orjson.dumps(text)
        except orjson.JSONEncodeError as exc:
            self.failures.append(Failure(position, FAILURE_INVALID, f"the text cannot be sent as JSON: {exc}"))
            return None
        item = Item(position, encoded, len(text))
        options = self.packer.options
        if not options.truncate and self.max_input_chars is not None and len(text) > self.max_input_chars:
            # TEI refuses it without tokenizing (its core/src/tokenization.rs: over max_input_length * 250 chars).
            self._too_long(item, FAILURE_TOO_LONG, f"{len(text)} characters; with truncation off TEI takes at most "
                           f"{self.max_input_chars} (max_input_length × 250)")
            return None
        if not self.packer.fits_alone(encoded, self.payload_limit):
            if options.truncate:
                return item  # cut by _shrink when it is taken, flagged truncated
            self._too_long(item, FAILURE_PAYLOAD, self._payload_detail(item, self.payload_limit))
            return None
        return item

    def _too_long(self, item: Item, reason: str, detail: str) -> None:
        """A text the servers would refuse: sent alone to be truncated (``on_too_long: truncate``), else failed."""
        if self.packer.options.on_too_long == ON_TOO_LONG_TRUNCATE:
            self._alone(item)
        else:
            self.failures.append(Failure(item.position, reason, detail))

    def _alone(self, item: Item) -> None:
        """Send ``item`` by itself with ``truncate: true`` (the job accepts truncated vectors)."""
        item.truncated = True
        self.put(Unit([item], truncating=True))

    def _shrink(self, unit: Unit | None, item: Item, packer: RequestPacker, payload_limit: int) -> None:
        """Cut ``item`` so that it fits alone if the job allows truncation, else fail it."""
        if packer.options.may_truncate and payload_limit - packer.overhead >= 64:
            text = packer.cut_to_fit(self.texts[item.position], payload_limit)
            if text:
                item.encoded, item.chars, item.truncated = orjson.dumps(text), len(text), True
                if unit is None and not packer.options.truncate:
                    # Fresh texts go with truncate off: send this one alone, truncated by the server.
                    self._pop(None)
                    self._alone(item)
                return
        self._pop(unit)
        self.failures.append(Failure(item.position, FAILURE_PAYLOAD, self._payload_detail(item, payload_limit)))

    def _payload_detail(self, item: Item, limit: int) -> str:
        return (f"the text alone makes a {self.packer.overhead + len(item.encoded)}-byte request, over the "
                f"{limit}-byte request limit")
