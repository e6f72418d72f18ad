"""The registry protocol across shards, with a real registry actor (no servers: a text's "vector" is made here).

Each shard is a :class:`ShardCopies` driven the way a shard task drives it: claims a batch, sends
what it owns, lands the vectors, waits for the copies other shards send, then ends.
"""

from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Callable, Iterator
from itertools import islice

import numpy as np
import pytest
import ray

from teibatch.pipeline.dedup import Dedup, DedupRegistry, ShardCopies, claim_sizes

pytestmark = pytest.mark.usefixtures("ray_session")

DIMENSION = 8
WAIT_S = 600.0  # a waiter must be let go long before this bound
PROMPTLY_S = 120.0


def digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def embed(text: str) -> np.ndarray:
    """The "servers'" vector of ``text``: random bits per call, so a copy shows whose vector it got."""
    return np.random.default_rng().standard_normal(DIMENSION).astype(np.float32)


@pytest.fixture
def dedup() -> Iterator[Dedup]:
    registry = ray.remote(DedupRegistry).options(max_concurrency=100).remote()  # type: ignore[arg-type]
    yield Dedup(registry, WAIT_S)
    ray.kill(registry)


def stats(dedup: Dedup, **expected: int) -> dict[str, int]:
    """The registry's stats once they show ``expected`` (boundedly): a shard's calls that do not wait
    for an answer (publish, keep) may run after a later call, as Ray does not order an async actor's calls."""
    for _ in range(600):
        got = dict(ray.get(dedup.registry.stats.remote()))
        if all(got[name] == value for name, value in expected.items()):
            break
        time.sleep(0.1)
    return got


class Shard:
    """One shard's texts and what it sent: the vector each text it sent got."""

    def __init__(self, name: str, texts: list[str], dedup: Dedup, contested: set[int] | None = None) -> None:
        self.texts = texts
        self.copies = ShardCopies(name, [digest(t) for t in texts], dedup, contested)
        self.sent: dict[int, np.ndarray] = {}

    def send(self, units: range) -> None:
        """Claim ``units`` (one batch) and land the vectors of those this shard sends."""
        self.land([unit for unit, _ in self.copies.decide([(u, self.texts[u]) for u in units])])

    def claim_only(self, unit: int) -> None:
        """Claim ``unit``'s text (this shard sends it) without landing its vector."""
        assert [u for u, _ in self.copies.decide([(unit, self.texts[unit])])] == [unit]

    def land(self, units: list[int], *, publish: bool = True) -> None:
        vectors = np.stack([embed(self.texts[u]) for u in units]) if units else np.zeros((0, DIMENSION))
        self.sent.update(zip(units, vectors, strict=True))
        ok = np.ones(len(units), dtype=bool)
        self.copies.landed(units, vectors, ok, ~ok, publish=publish)

    def finish(self) -> list[int]:
        """Wait for the other shards' copies, send what nobody sends for it, end; the units it sent late."""
        late = [unit for unit, _ in self.copies.wait()]
        self.land(late, publish=False)
        self.copies.release()
        return late

    def vector(self, unit: int) -> np.ndarray:
        """The vector written for ``unit``: sent here, or copied."""
        return self.sent[unit] if unit in self.sent else self.copies.copies[unit][1]


def in_thread(work: Callable[[], object]) -> Callable[[], float]:
    """Run ``work`` in a thread; the returned call joins it (boundedly) and says how long it took."""
    started, failures = time.monotonic(), []

    def run() -> None:
        try:
            work()
        except BaseException as error:  # surfaced to the test when it joins
            failures.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()

    def join() -> float:
        thread.join(WAIT_S)
        assert not thread.is_alive() and not failures, failures
        return time.monotonic() - started

    return join


def test_a_corpus_without_repeats_publishes_no_vector(dedup: Dedup) -> None:
    shards = [Shard(f"s{n}", [f"text {n}-{i}" for i in range(40)], dedup) for n in range(3)]
    for start in range(0, 40, 10):
        for shard in shards:
            shard.send(range(start, start + 10))
    for shard in shards:
        assert shard.finish() == []
        assert len(shard.sent) == 40
    held = 120 * DIMENSION * 4  # hashes, and vectors left in the object store, never read
    assert stats(dedup, vector_bytes=held) == {"texts": 120, "vector_bytes": held, "published_bytes": 0,
                                               "objects_read": 0}


def test_with_the_shared_texts_known_only_those_are_claimed(dedup: Dedup) -> None:
    # The id index says which texts another shard holds too: only those go to the registry.
    first = Shard("first", ["its own", "shared text", "its own too"], dedup, contested={1})
    second = Shard("second", ["shared text", "second's own"], dedup, contested={0})
    first.send(range(0, 3))
    second.send(range(0, 2))
    assert sorted(first.sent) == [0, 1, 2] and sorted(second.sent) == [1]
    assert stats(dedup)["texts"] == 1  # no claim for a text no other shard holds
    joined = in_thread(lambda: second.finish())  # waits for the vector the first shard keeps when it ends
    first.finish()
    assert joined() < PROMPTLY_S
    np.testing.assert_array_equal(second.vector(0), first.sent[1])  # the one text sent once, copied bit for bit


def test_a_contested_hash_gets_the_owners_exact_vector(dedup: Dedup) -> None:
    owner = Shard("owner", ["shared text", "owner's own", "owner's later text"], dedup)
    waiter = Shard("waiter", ["waiter's own", "shared text"], dedup)
    owner.send(range(0, 2))
    waiter.send(range(0, 2))  # contests "shared text": the owner is told in its next claim's answer
    assert sorted(waiter.sent) == [0]
    owner.send(range(2, 3))
    assert stats(dedup, published_bytes=DIMENSION * 4)["published_bytes"] == DIMENSION * 4  # that one, no other
    assert waiter.finish() == []
    np.testing.assert_array_equal(waiter.vector(1), owner.sent[0])  # bit for bit
    owner.finish()


def test_an_owner_waiting_itself_is_asked_for_its_vector_at_once(dedup: Dedup) -> None:
    silent = Shard("silent", ["text only silent sends"], dedup)
    owner = Shard("owner", ["shared text", "text only silent sends"], dedup)
    waiter = Shard("waiter", ["shared text"], dedup)
    silent.claim_only(0)  # on its way for a long time
    owner.send(range(0, 2))
    owner_done = in_thread(owner.finish)  # waits for silent's text, having claimed all of its own
    waiter.send(range(0, 1))  # contests "shared text" after the owner's last claim
    assert in_thread(waiter.finish)() < PROMPTLY_S  # the owner's wait was cut short to deliver it
    np.testing.assert_array_equal(waiter.vector(0), owner.sent[0])
    silent.land([0])
    silent.finish()  # its vector goes to the object store, where the owner takes it
    assert owner_done() < PROMPTLY_S
    np.testing.assert_array_equal(owner.vector(1), silent.sent[0])
    assert stats(dedup)["objects_read"] == 1


def test_an_owner_that_ends_without_delivering_lets_the_waiter_send_it(dedup: Dedup) -> None:
    owner = Shard("owner", ["shared text"], dedup)
    waiter = Shard("waiter", ["shared text"], dedup)
    owner.claim_only(0)  # never back from the servers
    waiter.send(range(0, 1))
    late: list[int] = []
    waiting = in_thread(lambda: late.extend(waiter.finish()))
    owner.copies.release()
    assert waiting() < PROMPTLY_S and late == [0]  # at once, not after the bound
    assert 0 in waiter.sent


def test_two_shards_contesting_each_others_hashes_both_finish(dedup: Dedup) -> None:
    texts = [f"text {i}" for i in range(40)]
    first = Shard("first", texts, dedup)
    second = Shard("second", texts[::-1], dedup)  # reads last what the first reads first, and the other way

    def run(shard: Shard) -> None:
        for start in range(0, len(texts), 8):
            shard.send(range(start, start + 8))
        shard.finish()

    joins = [in_thread(lambda shard=shard: run(shard)) for shard in (first, second)]  # type: ignore[misc]
    assert max(join() for join in joins) < PROMPTLY_S
    for unit in range(len(texts)):  # every text sent once, its copy with the very same vector
        np.testing.assert_array_equal(first.vector(unit), second.vector(len(texts) - 1 - unit))
    assert len(first.sent) + len(second.sent) == len(texts)
    assert first.sent and second.sent  # both owned some the other waited for


def test_a_later_shard_takes_an_ended_shards_vector_from_the_object_store(dedup: Dedup) -> None:
    ended = Shard("ended", ["text a", "text b"], dedup)
    ended.send(range(0, 2))
    ended.finish()
    later = Shard("later", ["text b", "text c"], dedup)
    later.send(range(0, 2))
    assert sorted(later.sent) == [1] and later.finish() == []
    np.testing.assert_array_equal(later.vector(0), ended.sent[1])
    assert stats(dedup)["published_bytes"] == 0 and stats(dedup)["objects_read"] == 1


def test_a_shard_s_claims_grow_from_a_few_hundred_hashes_to_a_few_thousand() -> None:
    # The first texts go out after a small claim; a large shard then claims in few Ray calls.
    assert list(islice(claim_sizes(), 5)) == [512, 2048, 8192, 8192, 8192]
