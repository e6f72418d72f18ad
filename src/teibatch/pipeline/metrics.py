"""Prometheus metrics of a run: its progress while it runs, its outcome when it ends.

:class:`MetricsReporter` listens to the run like any reporter and publishes what it hears to a
Pushgateway (``--metrics-push``), to a node-exporter textfile (``--metrics-textfile``), or both.
Every metric carries a ``teibatch_job`` label with the job's name; docs/metrics.md lists them all.

Publishing never stops or slows a run for long: a push has a short timeout, progress is sent at
most once per interval (less often while the gateway fails), and a failure is logged as one
warning (logger ``teibatch.metrics``), never raised.

``prometheus-client`` is loaded only when a reporter is made, so that importing this module needs
nothing beyond teibatch's core dependencies.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import unquote, urlsplit

from teibatch.errors import JobSpecError
from teibatch.pipeline.progress import SilentReporter

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric
    from prometheus_client.registry import Collector

log = logging.getLogger("teibatch.metrics")

DEFAULT_PUSH_INTERVAL_S = 15.0
DEFAULT_PUSH_TIMEOUT_S = 2.0
"""Per push, connecting and answering each: a gateway that hangs costs the run at most about this."""
MAX_BACKOFF_S = 300.0
"""While the gateway fails, progress pushes space out (doubling from the interval) up to this."""
GATEWAY_JOB = "teibatch"
"""The ``job`` part of the Pushgateway grouping key; the job's own name goes in ``teibatch_job``."""
JOB_LABEL = "teibatch_job"
STATUSES = ("running", "done", "incomplete", "interrupted", "failed")
"""Every status a run can have (``RunSummary.status``): the status gauge has one series for each."""
LAST_SUCCESS = "teibatch_last_success_timestamp_seconds"
INSTALL_HINT = "pip install 'teibatch[metrics]'"


class MetricsReporter(SilentReporter):
    """Publishes a run's progress and outcome as Prometheus metrics (see docs/metrics.md).

    ``push_url`` is a Pushgateway (``http://host:9091``; ``user:password@`` in it becomes basic auth
    and never appears in a log). Pushes use POST (``pushadd``), which replaces only the metrics
    pushed: the last success timestamp of an earlier run stays when a later run fails.
    ``textfile`` is written atomically (node exporter reads ``*.prom`` files); it carries the last
    success timestamp it held over into runs that did not succeed.
    """

    def __init__(self, job_name: str, *, push_url: str | None = None, textfile: str | None = None,
                 push_interval_s: float = DEFAULT_PUSH_INTERVAL_S,
                 push_timeout_s: float = DEFAULT_PUSH_TIMEOUT_S) -> None:
        prometheus = _prometheus()
        if push_interval_s <= 0:
            raise JobSpecError(f"must be more than 0 seconds, not {push_interval_s}", key="push_interval_s")
        self.job_name = job_name
        self.textfile = textfile
        self.push_interval_s = push_interval_s
        self.push_timeout_s = push_timeout_s
        self._gateway: str | None = None
        self._auth: tuple[str, str] | None = None
        if push_url:
            self._gateway, self._auth = _split_gateway(push_url)
        # This reporter is the registry's only collector, its metrics made afresh on every collect; their names
        # vary with the run's stage, so none are declared to check against (no describe, auto_describe off).
        self.registry: CollectorRegistry = prometheus.CollectorRegistry(auto_describe=False)
        self.registry.register(cast("Collector", self))
        self.run_id: str | None = None
        self._started_at: float | None = None
        self._planned: tuple[int, int] | None = None  # shards, documents
        self._done = [0, 0, 0]  # shards, documents, shards failed
        self._report: dict[str, Any] | None = None
        self._finished_at = 0.0
        self._next_publish = 0.0
        self._failures = 0
        self._warned: set[str] = set()
        self._previous_success: float | None = None
        self._previous_read = False

    @property
    def destinations(self) -> list[str]:
        """Where the metrics go, as a person reads them (the gateway without its credentials)."""
        return [d for d in (self._gateway, self.textfile) if d]

    def bind(self, run_id: str) -> None:
        self.run_id = run_id
        self._started_at = time.time()

    def start(self, shards: int, documents: int) -> None:
        self._planned = (shards, documents)
        self._tick(force=True)

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        self._done[0] += shards
        self._done[1] += documents
        if fields.get("status", "committed") != "committed":
            self._done[2] += shards
        self._tick()

    def finish(self, report: dict[str, Any]) -> None:
        self._report = report
        self._finished_at = time.time()
        self.publish()

    def publish(self) -> bool:
        """Push and write what is known now; True when every destination took it. Never raises."""
        pushed = self._guarded("push", self._push) if self._gateway else True
        written = self._guarded("textfile", self._write) if self.textfile else True
        return pushed and written

    def _tick(self, *, force: bool = False) -> None:
        """Publish progress unless the last publish was under an interval ago (longer after failures)."""
        now = time.monotonic()
        if not force and now < self._next_publish:
            return
        ok = self.publish()
        self._failures = 0 if ok else self._failures + 1
        wait = self.push_interval_s * 2 ** min(self._failures, 16)
        self._next_publish = now + min(wait, max(MAX_BACKOFF_S, self.push_interval_s))

    def _guarded(self, what: str, action: Callable[[], None]) -> bool:
        """Run ``action``; a failure is logged (a warning the first time for ``what``), never raised."""
        try:
            action()
        except Exception as exc:  # a metrics outage must never become a failed run
            level = logging.DEBUG if what in self._warned else logging.WARNING
            self._warned.add(what)
            target = self._gateway if what == "push" else self.textfile
            log.log(level, "could not publish metrics to %s (%s: %s); the run goes on", target,
                    type(exc).__name__, _redact(str(exc), self._auth))
            return False
        return True

    def _push(self) -> None:
        from prometheus_client import pushadd_to_gateway

        assert self._gateway is not None
        pushadd_to_gateway(self._gateway, job=GATEWAY_JOB, registry=self.registry,
                           grouping_key={JOB_LABEL: self.job_name}, timeout=self.push_timeout_s,
                           handler=_handler(self._auth))

    def _write(self) -> None:
        from prometheus_client import write_to_textfile

        assert self.textfile is not None
        if not self._previous_read:  # once: a run that does not succeed keeps the file's last success
            self._previous_read = True
            self._previous_success = _last_success_in(Path(self.textfile), self.job_name)
        write_to_textfile(self.textfile, self.registry)

    def collect(self) -> Iterator[Metric]:
        """Every metric as it stands: progress once the run started, the outcome once it finished."""
        from prometheus_client.core import GaugeMetricFamily, InfoMetricFamily

        job = self.job_name

        def gauge(name: str, doc: str, samples: Iterable[tuple[tuple[str, ...], float | None]],
                  labels: tuple[str, ...] = ()) -> GaugeMetricFamily:
            family = GaugeMetricFamily(name, doc, labels=[JOB_LABEL, *labels])
            for values, value in samples:
                if value is not None:  # a number the report lacks (say a busy share of no request): no sample
                    family.add_metric([job, *values], value)
            return family

        report = self._report or {}
        status = str(report.get("status", "running"))
        yield gauge("teibatch_run_status", "1 for the status of the latest run (running while it runs), else 0.",
                    [((s,), float(s == status)) for s in dict.fromkeys([*STATUSES, status])], ("status",))
        started = self._started_at or _timestamp(report.get("started_at"))
        if started is not None:
            yield gauge("teibatch_run_start_timestamp_seconds", "When the latest run began (Unix time).",
                        [((), started)])
        if self._planned is not None or self._report is not None:  # a run that embedded nothing shows zeros
            yield from _progress(gauge, self._planned or (0, 0), self._done)
        success = self._finished_at if status == "done" else self._previous_success
        if success:
            yield gauge(LAST_SUCCESS, "When a run of this job last ended done, every shard committed (Unix time).",
                        [((), success)])
        if self._report is None:
            return
        yield gauge("teibatch_last_run_timestamp_seconds", "When the latest run ended, whatever its status "
                    "(Unix time).", [((), self._finished_at)])
        info = InfoMetricFamily("teibatch_run", "The latest run's id (its report is runs/<run_id>.json).",
                                labels=[JOB_LABEL])
        info.add_metric([job], {"run_id": str(report.get("run_id", self.run_id or "")),
                                "version": str(report.get("teibatch_version", ""))})
        yield info
        yield from _outcome(gauge, report)


Gauge = Callable[..., "Metric"]


def _progress(gauge: Gauge, planned: tuple[int, int], done: list[int]) -> Iterator[Metric]:
    """The running run's progress: shards and documents set out to embed, finished, failed."""
    yield gauge("teibatch_progress_shards_planned", "Shards the latest run set out to embed (not those "
                "committed by earlier runs).", [((), planned[0])])
    yield gauge("teibatch_progress_documents_planned", "Documents in the shards the latest run set out to embed.",
                [((), planned[1])])
    yield gauge("teibatch_progress_shards_done", "Shards of the latest run finished so far, whatever their outcome.",
                [((), done[0])])
    yield gauge("teibatch_progress_documents_done", "Documents in the shards of the latest run finished so far.",
                [((), done[1])])
    yield gauge("teibatch_progress_shards_failed", "Shards of the latest run that failed or were not committed "
                "so far.", [((), done[2])])


def _outcome(gauge: Gauge, report: dict[str, Any]) -> Iterator[Metric]:
    """The finished run's numbers, from its report (``RunSummary.to_json``)."""
    documents, shards = report.get("documents", {}), report.get("shards", {})
    outcomes = ("embedded", "skipped_unchanged", "rejected", "waiting_for_servers")
    yield gauge("teibatch_run_documents_read", "Documents the latest run read (in the shards it committed).",
                [((), _number(documents.get("read")))])
    yield gauge("teibatch_run_documents", "Documents of the latest run by outcome.",
                [((o,), _number(documents.get(o))) for o in outcomes], ("outcome",))
    yield gauge("teibatch_run_documents_rejected", "Documents the latest run rejected, by reason.",
                [((r,), _number(n)) for r, n in documents.get("rejected_by_reason", {}).items()], ("reason",))
    yield gauge("teibatch_run_shards_planned", "Shards the corpus has (as the latest run planned them).",
                [((), _number(shards.get("total")))])
    yield gauge("teibatch_run_shards", "Shards by state at the end of the latest run.",
                [((s,), _number(shards.get(s))) for s in ("skipped_committed", "committed", "failed")], ("state",))
    timings = report.get("timings", {})
    yield gauge("teibatch_run_duration_seconds", "How long the latest run took, start to report.",
                [((), _number(timings.get("total_s")))])
    yield gauge("teibatch_run_phase_seconds", "Time the latest run spent in each phase.",
                [((k.removesuffix("_s"),), _number(v)) for k, v in timings.items() if k != "total_s"], ("phase",))
    yield gauge("teibatch_run_embedded_documents_per_second", "Documents embedded per second of embedding.",
                [((), _number(report.get("throughput_docs_per_s")))])
    yield from _servers(gauge, report.get("servers", {}))


SERVER_GAUGES = (  # report field, metric name, help
    ("requests", "teibatch_run_server_requests", "Requests the latest run sent each server and got answered."),
    ("inputs", "teibatch_run_server_inputs", "Inputs (documents) each server embedded in the latest run."),
    ("retries", "teibatch_run_server_retries", "Requests to each server the latest run sent again."),
    ("marked_down", "teibatch_run_server_marked_down", "Times the latest run took each server out as down."),
    ("max_in_flight", "teibatch_run_server_max_in_flight", "Most inputs in flight at once to each server."),
    ("mean_in_flight", "teibatch_run_server_mean_in_flight", "Mean inputs in flight to each server while used."),
    ("busy_share", "teibatch_run_server_busy_ratio", "Share (0-1) of the time from each server's first request "
     "to its last answer with a request in flight."),
    ("seconds", "teibatch_run_server_request_seconds", "Sum of the durations of each server's answered requests."),
    ("window", "teibatch_run_server_window", "Each server's concurrency window (inputs) at the end of the run."),
    ("copies", "teibatch_run_server_copies", "Copies of other servers' last requests each server was sent at the "
     "end of the latest run (tail hedging)."),
    ("copies_won", "teibatch_run_server_copies_answered_first", "Copies each server answered before the original's "
     "server did."),
)


def _servers(gauge: Gauge, servers: dict[str, dict[str, Any]]) -> Iterator[Metric]:
    """Per server (named by its URL without credentials): what the latest run's clients saw."""
    named = [(label_url(url), stats) for url, stats in servers.items()]
    for field, name, doc in SERVER_GAUGES:
        yield gauge(name, doc, [((url,), _number(s.get(field))) for url, s in named], ("server",))
    yield gauge("teibatch_run_server_errors", "Failed requests to each server in the latest run, by kind.",
                [((url, kind), _number(n)) for url, s in named for kind, n in s.get("errors", {}).items()],
                ("server", "kind"))


def label_url(url: str) -> str:
    """``url`` as a label: scheme, host, port and path only (no user, password, query or fragment)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "invalid-url"
    host = f"[{host}]" if ":" in host else host
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}{parts.path}" if parts.scheme else host


def _split_gateway(url: str) -> tuple[str, tuple[str, str] | None]:
    """The gateway's URL without credentials, and the credentials (for basic auth) if it had any."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise JobSpecError(f"not an http(s) URL: {label_url(url)}", key="--metrics-push")
    auth = (unquote(parts.username or ""), unquote(parts.password or "")) if parts.username else None
    return label_url(parts.geturl()).rstrip("/"), auth


def _handler(auth: tuple[str, str] | None) -> Callable[..., Callable[[], None]]:
    """prometheus-client's request handler, with basic auth when the gateway URL carried credentials."""
    from prometheus_client.exposition import basic_auth_handler, default_handler

    if auth is None:
        return default_handler

    def handler(url: str, method: str, timeout: float | None, headers: list[tuple[str, str]],
                data: bytes) -> Callable[[], None]:
        return basic_auth_handler(url, method, timeout, headers, data, auth[0], auth[1])

    return handler


def _redact(text: str, auth: tuple[str, str] | None) -> str:
    return text.replace(auth[1], "***") if auth and auth[1] else text


def _last_success_in(path: Path, job: str) -> float | None:
    """The last success timestamp of ``job`` in an earlier textfile, if there is one and it parses."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = path.read_text()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == LAST_SUCCESS and sample.labels.get(JOB_LABEL) == job:
                    return float(sample.value)
    except (OSError, ValueError):  # no earlier file, or not one we can read: nothing to carry over
        return None
    return None


def _timestamp(iso: object) -> float | None:
    try:
        return datetime.fromisoformat(str(iso)).timestamp() if iso else None
    except ValueError:
        return None


def _number(value: object) -> float | None:
    """A report number as a sample value; None (no sample) for one the report lacks."""
    return float(value) if isinstance(value, int | float) else None


def _prometheus() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise JobSpecError(f"--metrics-push and --metrics-textfile need prometheus-client: {INSTALL_HINT}") from exc
    return prometheus_client
