"""Progress on long runs: a live bar on a terminal, plain timestamped lines for cron and logs."""

from __future__ import annotations

import sys
import time
from typing import IO, Protocol

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

PLAIN_INTERVAL_S = 10.0


class Reporter(Protocol):
    """Receives the run's milestones; the pipeline never prints by itself."""

    def message(self, text: str) -> None: ...
    def start(self, shards: int, documents: int) -> None: ...
    def advance(self, shards: int, documents: int) -> None: ...
    def stop(self) -> None: ...


def reporter_for(stream: IO[str] | None = None, *, quiet: bool = False) -> Reporter:
    """A live display when ``stream`` is a terminal, plain lines otherwise, nothing when ``quiet``."""
    stream = stream or sys.stderr
    if quiet:
        return SilentReporter()
    if stream.isatty():
        return LiveReporter(stream)
    return LineReporter(stream)


class SilentReporter:
    def message(self, text: str) -> None: ...
    def start(self, shards: int, documents: int) -> None: ...
    def advance(self, shards: int, documents: int) -> None: ...
    def stop(self) -> None: ...


class LineReporter:
    """One line per milestone and at most one progress line every ``interval`` seconds."""

    def __init__(self, stream: IO[str], interval: float = PLAIN_INTERVAL_S) -> None:
        self.stream = stream
        self.interval = interval
        self._shards = self._documents = self._done_shards = self._done_documents = 0
        self._started = self._last = time.monotonic()

    def _print(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self.stream, flush=True)

    def message(self, text: str) -> None:
        self._print(text)

    def start(self, shards: int, documents: int) -> None:
        self._shards, self._documents = shards, documents
        self._started = self._last = time.monotonic()
        self._print(f"embedding {documents:,} documents in {shards:,} shards")

    def advance(self, shards: int, documents: int) -> None:
        self._done_shards += shards
        self._done_documents += documents
        now = time.monotonic()
        if now - self._last >= self.interval or self._done_shards == self._shards:
            self._last = now
            rate = self._done_documents / max(now - self._started, 1e-9)
            left = max(self._documents - self._done_documents, 0)
            eta = f", ETA {left / rate:.0f}s" if rate > 0 and left else ""
            self._print(f"shards {self._done_shards}/{self._shards}, documents "
                        f"{self._done_documents:,}/{self._documents:,}, {rate:,.0f} docs/s{eta}")

    def stop(self) -> None: ...


class LiveReporter:
    """A rich progress bar: documents, docs/s, shards done and time remaining."""

    def __init__(self, stream: IO[str]) -> None:
        self.console = Console(file=stream)
        self.progress = Progress(
            TextColumn("[bold]embedding"), BarColumn(), MofNCompleteColumn(),
            TextColumn("docs · {task.fields[rate]} docs/s · shards {task.fields[shards]}"),
            TimeRemainingColumn(), console=self.console, transient=False)
        self._task: TaskID | None = None
        self._shards = self._done_shards = 0
        self._started = time.monotonic()

    def message(self, text: str) -> None:
        self.console.print(text, highlight=False, markup=False)

    def start(self, shards: int, documents: int) -> None:
        self._shards = shards
        self._started = time.monotonic()
        self.progress.start()
        self._task = self.progress.add_task("embed", total=documents, rate="-", shards=f"0/{shards}")

    def advance(self, shards: int, documents: int) -> None:
        if self._task is None:
            return
        self._done_shards += shards
        self.progress.advance(self._task, documents)
        done = self.progress.tasks[0].completed
        rate = done / max(time.monotonic() - self._started, 1e-9)
        self.progress.update(self._task, rate=f"{rate:,.0f}", shards=f"{self._done_shards}/{self._shards}")

    def stop(self) -> None:
        if self._task is not None:
            self.progress.stop()
            self._task = None
