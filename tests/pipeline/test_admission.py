"""Chunks enter a sender oldest shard task first, a bounded number at once, and no slot is ever lost."""

from __future__ import annotations

import asyncio

from teibatch.pipeline.admission import OldestFirst


async def _holder(gate: OldestFirst, priority: float, order: list[float], hold: asyncio.Event) -> None:
    async with gate.slot(priority):
        order.append(priority)
        await hold.wait()


def test_waiters_enter_lowest_priority_first_then_in_arrival_order() -> None:
    async def scenario() -> list[float]:
        gate, order, hold = OldestFirst(1), [], asyncio.Event()
        first = asyncio.create_task(_holder(gate, 5.0, order, hold))
        await asyncio.sleep(0)  # the first takes the only slot
        waiters = [asyncio.create_task(_holder(gate, p, order, hold)) for p in (3.0, 1.0, 3.0, 2.0)]
        await asyncio.sleep(0)
        assert gate.waiting == 4 and order == [5.0]
        hold.set()
        await asyncio.gather(first, *waiters)
        return order

    assert asyncio.run(scenario()) == [5.0, 1.0, 2.0, 3.0, 3.0]


def test_no_more_than_slots_hold_at_once() -> None:
    async def scenario() -> int:
        gate, most, holding = OldestFirst(3), 0, 0

        async def work(priority: float) -> None:
            nonlocal most, holding
            async with gate.slot(priority):
                holding += 1
                most = max(most, holding)
                await asyncio.sleep(0.001)
                holding -= 1

        await asyncio.gather(*(work(i % 5) for i in range(40)))
        return most

    assert asyncio.run(scenario()) == 3


def test_a_cancelled_waiter_gives_its_turn_away_and_a_slot_is_never_lost() -> None:
    async def scenario() -> list[float]:
        gate, order, hold = OldestFirst(1), [], asyncio.Event()
        first = asyncio.create_task(_holder(gate, 0.0, order, hold))
        await asyncio.sleep(0)
        cancelled = asyncio.create_task(_holder(gate, 1.0, order, hold))
        later = asyncio.create_task(_holder(gate, 2.0, order, hold))
        await asyncio.sleep(0)
        cancelled.cancel()
        hold.set()
        await asyncio.gather(first, later)
        # Every slot came back: a new holder enters at once.
        async with asyncio.timeout(1):
            async with gate.slot(9.0):
                order.append(9.0)
        return order

    assert asyncio.run(scenario()) == [0.0, 2.0, 9.0]


def test_a_waiter_cancelled_just_as_it_was_admitted_passes_the_slot_on() -> None:
    async def scenario() -> list[float]:
        gate, order, hold = OldestFirst(1), [], asyncio.Event()
        hold.set()
        held = gate.slot(0.0)
        await held.__aenter__()
        admitted_then_cancelled = asyncio.create_task(_holder(gate, 1.0, order, hold))
        later = asyncio.create_task(_holder(gate, 2.0, order, hold))
        await asyncio.sleep(0)
        await held.__aexit__(None, None, None)  # hands the slot to priority 1.0, whose task has not run yet...
        admitted_then_cancelled.cancel()  # ...and is cancelled before it does
        async with asyncio.timeout(2):  # a slot lost with the cancelled waiter would block `later` for ever
            await asyncio.gather(later, admitted_then_cancelled, return_exceptions=True)
        return order

    assert asyncio.run(scenario()) == [2.0]


def test_a_slot_given_back_early_admits_the_next_waiter_and_is_not_freed_twice() -> None:
    async def scenario() -> list[str]:
        gate, order = OldestFirst(1), []
        tail, later_done = asyncio.Event(), asyncio.Event()

        async def chunk_in_its_tail() -> None:
            async with gate.slot(0.0) as give_back:
                order.append("first sends everything")
                give_back()
                give_back()  # said twice: counts once
                await tail.wait()  # waits for its answers without the slot
                order.append("first answered")

        async def waiter(name: str, priority: float) -> None:
            async with gate.slot(priority):
                order.append(name)
                if name == "second":
                    await later_done.wait()

        first = asyncio.create_task(chunk_in_its_tail())
        await asyncio.sleep(0)
        second = asyncio.create_task(waiter("second", 1.0))
        third = asyncio.create_task(waiter("third", 2.0))
        for _ in range(3):
            await asyncio.sleep(0)
        assert order == ["first sends everything", "second"]  # admitted while the first is still out
        tail.set()
        await first
        assert gate.waiting == 1  # the first's end freed nothing more: the third still waits for the second
        later_done.set()
        await asyncio.gather(second, third)
        return order

    assert asyncio.run(scenario()) == ["first sends everything", "second", "first answered", "third"]
