"""The head start's texts: the first shard's first texts, which the driver reads and sends itself.

The driver sends them to the senders as ordinary chunks before the servers' probe (they wait
there), and its own requests of them from the probe on (``pipeline/head_start_requests.py``); why,
and in which order, is the run's opening (``pipeline/opening.py``). The shard task takes those
chunks' results as its own and sends the rest of its texts itself.

Nothing rests on the driver's reading: the task reads the same documents again (it needs their ids,
hashes and rejects anyway) and checks that its first texts are the ones the driver sent (a digest);
if they are not (the corpus changed in between), it drops the driver's results and sends its texts
itself. A shard whose earlier parts may hold some of its vectors (incremental mode) gets no head
start: which texts it sends is known only once it has read those parts. Nor does a chunked job: its
texts are chunks, which only its shard tasks cut (with the token rule they load), so every chunk is
sent once, by its task.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from teibatch.corpus import CorpusOptions, Document, Shard, read_shard
from teibatch.pipeline.senders.plans import SenderRef, least_loaded

log = logging.getLogger(__name__)

# Texts a head start holds at least: a second or two of work for a few GPUs, whatever their budgets.
MIN_HEAD_START_TEXTS = 2048
# A head start holds at most this much text in the driver (many very long documents).
MAX_HEAD_START_CHARS = 16 * 1024 * 1024
# Admission priority of the head start's chunks in the senders: before every shard task's (their start times).
HEAD_START_PRIORITY = 0.0


@dataclass(frozen=True)
class SentChunk:
    """One chunk the driver sent: texts ``start`` to ``start + length``, to sender ``sender``; ``result``: its ref."""

    start: int
    length: int
    sender: int
    result: Any  # ray.ObjectRef of the sender's EmbedResult


@dataclass(frozen=True)
class HeadStart:
    """The first ``count`` texts of a shard, already on their way; ``digest`` says which texts they were."""

    count: int
    digest: str
    chunks: tuple[SentChunk, ...]


def texts_digest(texts: Iterable[str]) -> str:
    """A digest of ``texts`` in order (each one length-prefixed, so no two lists share one)."""
    digest = hashlib.blake2b(digest_size=16)
    for text in texts:
        encoded = text.encode("utf-8", "surrogatepass")
        digest.update(len(encoded).to_bytes(8, "little"))
        digest.update(encoded)
    return digest.hexdigest()


class HeadStartTexts:
    """A shard's first texts, read and sent as far as asked: some before the servers' probe, the rest after.

    A shard that cannot be read gets no head start (:attr:`failed`): its task meets the same error
    and reports it.
    """

    def __init__(self, corpus: CorpusOptions, shard: Shard, *, distinct: bool = False) -> None:
        self.corpus, self.shard = corpus, shard
        self.texts: list[str] = []
        # With deduplication the task sends each text once (``pipeline/dedup.py``): so does the head start.
        self._seen: set[str] | None = set() if distinct else None
        self.failed = False
        self._chars = 0
        self._items: Iterator[object] | None = None
        self._ended = False
        self._chunks: list[SentChunk] = []
        self._load: list[int] = []  # texts sent to each sender

    def read(self, count: int) -> None:
        """Read on until ``count`` texts are held, the shard ends or :data:`MAX_HEAD_START_CHARS` is reached."""
        try:
            if self._items is None:
                self._items = iter(read_shard(self.corpus, self.shard))
            while not self._ended and len(self.texts) < count and self._chars < MAX_HEAD_START_CHARS:
                item = next(self._items, None)
                if item is None:
                    self._ended = True
                elif isinstance(item, Document):
                    if self._seen is not None:
                        if item.text in self._seen:
                            continue
                        self._seen.add(item.text)
                    self.texts.append(item.text)
                    self._chars += len(item.text)
        except Exception as exc:  # the shard task reads it again and reports what is wrong, per shard
            log.debug("no head start for shard %s: %s", self.shard.id, exc)
            self._ended = self.failed = True

    def read_chunks(self, count: int, chunk_size: int) -> None:
        """:meth:`read` on to ``count`` texts rounded up to whole chunks of ``chunk_size`` (as :meth:`send` does)."""
        self.read(math.ceil(count / chunk_size) * chunk_size)

    def send(self, senders: Sequence[SenderRef], count: int, requested: Collection[int] = ()) -> None:
        """Read on to ``count`` texts, rounded up to whole chunks, and send those not sent yet over ``senders``.

        Each chunk goes to the sender with the least of them per unit of its budget. ``senders`` may
        be planned before the servers' probe (no dimension yet): their chunks wait in the senders.
        ``requested``: the first texts' positions of the chunks whose requests the driver sends itself
        (``pipeline/head_start_requests.py``): those wait in their sender for the driver's vectors.
        """
        chunk_size = min(s.chunk_size for s in senders)
        self.read_chunks(count, chunk_size)
        if self.failed:
            return
        load = self._load or [0] * len(senders)
        for start in range(self._sent, len(self.texts), chunk_size):
            chunk = self.texts[start:start + chunk_size]
            index = least_loaded(senders, load)
            sender = senders[index]
            key = start if start in requested else None
            result = sender.actor.embed.remote(chunk, HEAD_START_PRIORITY, sender.plan, key)
            self._chunks.append(SentChunk(start, len(chunk), index, result))
            load[index] += len(chunk)
        self._load = load

    def sender_of(self, start: int) -> int:
        """The index of the sender that chunk ``start`` was sent to."""
        return next(chunk.sender for chunk in self._chunks if chunk.start == start)

    def head_start(self) -> HeadStart | None:
        """What was sent, for the shard's task; ``None`` if nothing was (an empty or unreadable shard)."""
        if self.failed or not self._chunks:
            return None
        return HeadStart(self._sent, texts_digest(self.texts[:self._sent]), tuple(self._chunks))

    def sent_texts(self) -> list[str]:
        """The texts sent so far, in order (none from a shard that could not be read)."""
        return [] if self.failed else self.texts[:self._sent]

    @property
    def _sent(self) -> int:
        """How many of the first texts have been sent (the chunks follow one another from the first)."""
        return sum(chunk.length for chunk in self._chunks)


def send_head_start(first: HeadStartTexts, senders: Sequence[SenderRef]) -> HeadStart | None:
    """Send ``first`` on to the senders' whole budget (at least :data:`MIN_HEAD_START_TEXTS`): the whole head start.

    ``None`` if there is nothing to send (an empty or unreadable shard).
    """
    first.send(senders, max(MIN_HEAD_START_TEXTS, sum(s.budget for s in senders)))
    return first.head_start()
