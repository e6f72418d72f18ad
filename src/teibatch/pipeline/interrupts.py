"""SIGINT and SIGTERM during a run: stop at once, yet always tear down and write the report.

Python turns SIGINT into ``KeyboardInterrupt`` wherever the main thread happens to be; when that is
inside a ``__del__`` or a callback, the exception is printed ("Exception ignored in ...") and lost,
and the run would go on as if nothing happened. So the handler also *records* the signal, and the
driver calls :meth:`Interrupts.check` at its safe points: a lost interrupt is raised again there. A
second signal while the run is already stopping is recorded but not raised, so that it cannot cut
the teardown or the report short (the teardown is bounded; SIGKILL remains for the impatient).
From the first signal on, what Ray's core writes to descriptor 2 is dropped (:mod:`teibatch.native_stderr`).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from types import FrameType

from teibatch.native_stderr import quiet_native


class Interrupts:
    """The signals a run received; installed as the SIGINT and SIGTERM handler by :func:`catch_interrupts`."""

    def __init__(self) -> None:
        self.received: list[int] = []

    def handle(self, signum: int, frame: FrameType | None) -> None:
        self.received.append(signum)
        quiet_native()  # Ray's core reports its own teardown from here on (teibatch/native_stderr.py)
        if len(self.received) == 1:
            raise KeyboardInterrupt

    def check(self) -> None:
        """Raise ``KeyboardInterrupt`` if a signal came (even one whose exception was lost)."""
        if self.received:
            raise KeyboardInterrupt


@contextmanager
def catch_interrupts() -> Iterator[Interrupts]:
    """Handle SIGINT and SIGTERM as interrupts for the block (outside the main thread: record nothing)."""
    interrupts = Interrupts()
    previous: dict[int, object] = {}
    with suppress(ValueError):  # not the main thread: leave signals alone
        for signum in (int(signal.SIGINT), int(signal.SIGTERM)):
            previous[signum] = signal.signal(signum, interrupts.handle)
    try:
        yield interrupts
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)  # type: ignore[arg-type]


def reinstall(interrupts: Interrupts) -> None:
    """Take SIGTERM back after a library replaced its handler (Ray's core installs a crash handler for it)."""
    with suppress(ValueError):
        signal.signal(signal.SIGTERM, interrupts.handle)
