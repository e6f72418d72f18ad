"""Progress on long runs: a live bar on a terminal, plain timestamped lines for cron and logs,
JSON lines for machines; reporters fan out (the run report and the metrics listen the same way).

Every event has a name (``event``) and fields: ``message`` events carry what a person reads, and
``advance`` carries the shard that just finished (``shard``, ``status``: committed, failed or not
committed, ``rows``, ``rejects``), or, with ``status: running`` and no shard done, documents whose
vectors landed in a shard still running (``pipeline/landed.py``; the JSON lines call it ``progress``).
``finish`` receives the run's final report (``runs/<id>.json``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import IO, Any, Protocol

import orjson
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn

PLAIN_INTERVAL_S = 10.0
ETA_MIN_SPAN_S = 5.0
"""Seconds of documents coming back, after the first shard finished, before an ETA is shown."""


class Reporter(Protocol):
    """Receives the run's milestones; the pipeline never prints by itself."""

    def bind(self, run_id: str) -> None: ...
    def message(self, text: str, *, event: str = "message", **fields: Any) -> None: ...
    def start(self, shards: int, documents: int) -> None: ...
    def advance(self, shards: int, documents: int, **fields: Any) -> None: ...
    def stop(self) -> None: ...
    def finish(self, report: dict[str, Any]) -> None: ...


def reporter_for(stream: IO[str] | None = None, *, quiet: bool = False, log_format: str = "text") -> Reporter:
    """JSON lines with ``log_format="json"``; else a live display on a terminal, plain lines
    elsewhere, nothing when ``quiet``."""
    stream = stream or sys.stderr
    if log_format == "json":
        return JsonLinesReporter(stream)
    if quiet:
        return SilentReporter()
    if stream.isatty():
        return LiveReporter(stream)
    return LineReporter(stream)


class SilentReporter:
    """Hears everything, says nothing; the base of the others (each overrides what it shows)."""

    def bind(self, run_id: str) -> None: ...
    def message(self, text: str, *, event: str = "message", **fields: Any) -> None: ...
    def start(self, shards: int, documents: int) -> None: ...
    def advance(self, shards: int, documents: int, **fields: Any) -> None: ...
    def stop(self) -> None: ...
    def finish(self, report: dict[str, Any]) -> None: ...


class Reporters(SilentReporter):
    """Several reporters as one: every event goes to each, in order."""

    def __init__(self, *reporters: Reporter) -> None:
        self.reporters = reporters

    def bind(self, run_id: str) -> None:
        for reporter in self.reporters:
            reporter.bind(run_id)

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        for reporter in self.reporters:
            reporter.message(text, event=event, **fields)

    def start(self, shards: int, documents: int) -> None:
        for reporter in self.reporters:
            reporter.start(shards, documents)

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        for reporter in self.reporters:
            reporter.advance(shards, documents, **fields)

    def stop(self) -> None:
        for reporter in self.reporters:
            reporter.stop()

    def finish(self, report: dict[str, Any]) -> None:
        for reporter in self.reporters:
            reporter.finish(report)


class JsonLinesReporter(SilentReporter):
    """One JSON object a line for every event: time, level, event, run id, and the event's fields.

    Meant for log collectors (``--log-format json``): every line parses alone and carries the run id.
    """

    def __init__(self, stream: IO[str]) -> None:
        self.stream = stream
        self.run_id: str | None = None
        self._shards = self._documents = self._done_shards = self._done_documents = 0

    def emit(self, event: str, level: str = "info", **fields: Any) -> None:
        line = {"time": datetime.now(UTC).isoformat(timespec="milliseconds"), "level": level, "event": event,
                "run_id": self.run_id, **fields}
        self.stream.write(orjson.dumps(line, default=str).decode() + "\n")
        self.stream.flush()

    def bind(self, run_id: str | None) -> None:
        self.run_id = run_id

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        level = "warning" if event in WARNING_EVENTS else "info"
        self.emit(event, level, message=text, **fields)

    def start(self, shards: int, documents: int) -> None:
        self._shards, self._documents = shards, documents
        self.emit("embedding_started", shards=shards, documents=documents)

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        self._done_shards += shards
        self._done_documents += documents
        status = fields.get("status", "committed")
        level = "info" if status in ("committed", "running") else "warning"
        self.emit("progress" if status == "running" else "shard_finished", level, **fields,
                  shards_done=self._done_shards, shards_total=self._shards,
                  documents_done=self._done_documents, documents_total=self._documents)

    def finish(self, report: dict[str, Any]) -> None:
        level = "info" if report.get("status") == "done" else "error"
        self.emit("run_finished", level, status=report.get("status"), documents=report.get("documents"),
                  shards=report.get("shards"), seconds=report.get("timings", {}).get("total_s"),
                  errors=report.get("errors", [])[:5])


class ReportCapture(SilentReporter):
    """Keeps the final report it is given, whatever way the run ended (for ``run --json``)."""

    def __init__(self) -> None:
        self.report: dict[str, Any] | None = None

    def finish(self, report: dict[str, Any]) -> None:
        self.report = report


# Events that tell of something going wrong (the JSON lines mark them as warnings).
WARNING_EVENTS = frozenset({"server_fault", "shard_failed", "shard_not_committed", "lock_taken_over", "server_lost",
                            "server_not_replaced"})


class Eta:
    """Time left, from the rate of real progress only: none until it can be measured.

    The first shard to finish carries the run's start-up (workers starting, the first requests),
    so a rate counted from the start foretells a run many times too long.
    The rate is measured from the first finished shard on, over the documents that finished after
    it, and only once :data:`ETA_MIN_SPAN_S` seconds have passed since: before that, no ETA.
    """

    def __init__(self) -> None:
        self._first: tuple[float, int] | None = None  # when the first shard finished, documents done then

    def seconds_left(self, done: int, total: int, now: float) -> float | None:
        """Seconds until ``total`` documents are done, ``done`` of them now; ``None`` while unmeasured."""
        if self._first is None:
            if done > 0:
                self._first = (now, done)
            return None
        since, measured = now - self._first[0], done - self._first[1]
        if since < ETA_MIN_SPAN_S or measured <= 0 or done >= total:
            return None
        return (total - done) * since / measured


class LineReporter(SilentReporter):
    """One line per milestone and at most one progress line every ``interval`` seconds."""

    def __init__(self, stream: IO[str], interval: float = PLAIN_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.stream = stream
        self.interval = interval
        self.clock = clock
        self._shards = self._documents = self._done_shards = self._done_documents = 0
        self._started = self._last = clock()
        self._eta = Eta()

    def _print(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {text}", file=self.stream, flush=True)

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self._print(text)

    def start(self, shards: int, documents: int) -> None:
        self._shards, self._documents = shards, documents
        self._started = self._last = self.clock()
        self._eta = Eta()
        self._print(f"embedding {documents:,} documents in {shards:,} shards")

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        self._done_shards += shards
        self._done_documents += documents
        now = self.clock()
        left = self._eta.seconds_left(self._done_documents, self._documents, now)
        if now - self._last >= self.interval or self._done_shards == self._shards:
            self._last = now
            rate = self._done_documents / max(now - self._started, 1e-9)
            eta = f", ETA {left:.0f}s" if left is not None else ""
            self._print(f"shards {self._done_shards}/{self._shards}, documents "
                        f"{self._done_documents:,}/{self._documents:,}, {rate:,.0f} docs/s{eta}")


class LiveReporter(SilentReporter):
    """A rich progress bar: documents, docs/s, shards done and time remaining."""

    def __init__(self, stream: IO[str]) -> None:
        self.console = Console(file=stream)
        self.progress = Progress(
            TextColumn("[bold]embedding"), BarColumn(), MofNCompleteColumn(),
            TextColumn("docs · {task.fields[rate]} docs/s · shards {task.fields[shards]} · ETA {task.fields[eta]}"),
            console=self.console, transient=False)
        self._task: TaskID | None = None
        self._shards = self._done_shards = 0
        self._started = time.monotonic()
        self._eta = Eta()

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self.console.print(text, highlight=False, markup=False)

    def start(self, shards: int, documents: int) -> None:
        self._shards = shards
        self._started = time.monotonic()
        self.progress.start()
        self._task = self.progress.add_task("embed", total=documents, rate="-", shards=f"0/{shards}", eta="-")

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        if self._task is None:
            return
        self._done_shards += shards
        self.progress.advance(self._task, documents)
        task = self.progress.tasks[0]
        now = time.monotonic()
        rate = task.completed / max(now - self._started, 1e-9)
        left = self._eta.seconds_left(int(task.completed), int(task.total or 0), now)
        self.progress.update(self._task, rate=f"{rate:,.0f}", shards=f"{self._done_shards}/{self._shards}",
                             eta="-" if left is None else f"{left:.0f}s")

    def stop(self) -> None:
        if self._task is not None:
            self.progress.stop()
            self._task = None


STATUS_RUNNING = "running"
"""The status of an ``advance`` that counts documents landed inside a shard still running."""


class InShardProgress(SilentReporter):
    """Passes every event on to ``reporter``; documents landed inside running shards go as
    ``advance(0, n, shard=…, status="running")``, and a shard's final ``advance`` carries only what was
    not counted before, so the documents add up to the shards' sizes."""

    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self._counted: dict[str, int] = {}
        self._sizes: dict[str, int] = {}

    def landed(self, counts: dict[str, int]) -> None:
        """Documents that landed per running shard since the last call (never more than its size: a
        task Ray ran again counts from its start again)."""
        for shard, documents in counts.items():
            if shard not in self._counted:
                continue
            documents = min(documents, self._sizes[shard] - self._counted[shard])
            if documents > 0:
                self._counted[shard] += documents
                self.reporter.advance(0, documents, shard=shard, status=STATUS_RUNNING)

    def started(self, shard: str, size: int) -> None:
        """``shard``'s task was started, for ``size`` documents: what lands from it counts."""
        self._counted.setdefault(shard, 0)
        self._sizes[shard] = size

    def bind(self, run_id: str) -> None:
        self.reporter.bind(run_id)

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self.reporter.message(text, event=event, **fields)

    def start(self, shards: int, documents: int) -> None:
        self.reporter.start(shards, documents)

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        counted = self._counted.pop(fields.get("shard", ""), 0)
        self.reporter.advance(shards, max(0, documents - counted), **fields)

    def stop(self) -> None:
        self.reporter.stop()

    def finish(self, report: dict[str, Any]) -> None:
        self.reporter.finish(report)
