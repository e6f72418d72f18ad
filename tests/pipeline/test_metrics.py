"""MetricsReporter: pushes to a Pushgateway stand-in, throttling, outages, the textfile, a whole run."""

from __future__ import annotations

import base64
import logging
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from teibatch.errors import JobSpecError
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.metrics import LAST_SUCCESS, MetricsReporter, label_url

GROUP_PATH = "/metrics/job/teibatch/teibatch_job/nightly-index"


@dataclass
class Push:
    method: str
    path: str
    body: str
    headers: dict[str, str]

    def samples(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        """Every sample of the body by (name, labels)."""
        return {(s.name, frozenset(s.labels.items())): s.value
                for family in text_string_to_metric_families(self.body) for s in family.samples}

    def value(self, name: str, **labels: str) -> float | None:
        """The one sample named ``name`` whose labels include ``labels`` (None when there is none)."""
        found = [v for (n, ls), v in self.samples().items() if n == name and set(labels.items()) <= ls]
        assert len(found) <= 1, f"{name} {labels}: {len(found)} samples"
        return found[0] if found else None


@dataclass
class Gateway:
    """A Pushgateway stand-in: records every request and answers 200."""

    url: str
    pushes: list[Push] = field(default_factory=list)


@pytest.fixture
def gateway(monkeypatch: pytest.MonkeyPatch) -> Iterator[Gateway]:
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)  # urllib honours them; the stand-in is on 127.0.0.1
    pushes: list[Push] = []

    class Handler(BaseHTTPRequestHandler):
        def _record(self) -> None:
            length = int(self.headers.get("Content-Length", 0))
            body = self.rfile.read(length).decode()
            pushes.append(Push(self.command, self.path, body, dict(self.headers.items())))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        do_POST = do_PUT = do_DELETE = _record

        def log_message(self, format: str, *args: Any) -> None:  # quiet test output
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield Gateway(f"http://127.0.0.1:{server.server_address[1]}", pushes)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


def closed_port() -> int:
    """A port on 127.0.0.1 that nothing listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def report(status: str = "done") -> dict[str, Any]:
    """A run report as ``RunSummary.to_json`` makes it: two servers, one named with credentials."""
    return {
        "run_id": "20250101T020000Z-abc123", "status": status, "teibatch_version": "0.1.0",
        "shards": {"total": 6, "skipped_committed": 1, "committed": 4 if status == "done" else 3,
                   "failed": 0 if status == "done" else 1},
        "documents": {"read": 120, "embedded": 110, "skipped_unchanged": 7, "rejected": 3, "waiting_for_servers": 0,
                      "rejected_by_reason": {"empty_text": 2, "input_too_long": 1}},
        "timings": {"plan_s": 0.2, "fleet_up_s": 1.5, "embed_s": 10.0, "total_s": 12.5},
        "throughput_docs_per_s": 11.0,
        "servers": {
            "http://127.0.0.1:8081": {"requests": 30, "inputs": 60, "retries": 2, "errors": {"TeiOverloaded": 2},
                                      "seconds": 8.1, "marked_down": 0, "max_in_flight": 32,
                                      "mean_inputs_per_request": 2.0, "busy_seconds": 9.0, "mean_in_flight": 12.5,
                                      "busy_share": 0.9, "window": 32, "window_decreases": 1},
            "http://admin:hunter2@127.0.0.1:8082/?token=s3cret": {
                "requests": 25, "inputs": 50, "retries": 0, "errors": {}, "seconds": 7.0, "marked_down": 1,
                "max_in_flight": 16, "mean_inputs_per_request": 2.0, "busy_seconds": 6.0, "mean_in_flight": None,
                "busy_share": 0.6, "window": 16, "window_decreases": 0}},
        "errors": [], "started_at": "2025-01-01T02:00:00+00:00", "progress": [], "events": [],
    }


def drive(reporter: MetricsReporter, status: str = "done", advances: int = 5) -> None:
    """One run's events, as run_job sends them."""
    reporter.bind("20250101T020000Z-abc123")
    reporter.message("2 local server(s) ready", event="servers_ready")
    reporter.start(advances, advances * 24)
    for i in range(advances):
        reporter.advance(1, 24, shard=f"s{i}", status="failed" if status != "done" and i == 0 else "committed")
    reporter.stop()
    reporter.finish(report(status))


def test_pushes_progress_then_the_outcome(gateway: Gateway) -> None:
    before = time.time()
    drive(MetricsReporter("nightly-index", push_url=gateway.url, push_interval_s=60))
    assert [(p.method, p.path) for p in gateway.pushes] == [("POST", GROUP_PATH)] * 2  # at start, at finish
    progress, final = gateway.pushes
    assert progress.value("teibatch_run_status", status="running", teibatch_job="nightly-index") == 1
    assert progress.value("teibatch_progress_documents_planned") == 120
    assert progress.value("teibatch_progress_documents_done") == 0
    assert progress.value(LAST_SUCCESS) is None
    assert final.value("teibatch_run_status", status="done") == 1
    assert final.value("teibatch_run_status", status="running") == 0
    assert final.value("teibatch_progress_shards_done") == 5
    assert final.value("teibatch_progress_documents_done") == 120
    assert final.value("teibatch_run_documents", outcome="embedded") == 110
    assert final.value("teibatch_run_documents", outcome="skipped_unchanged") == 7
    assert final.value("teibatch_run_documents_rejected", reason="input_too_long") == 1
    assert final.value("teibatch_run_shards", state="committed") == 4
    assert final.value("teibatch_run_duration_seconds") == 12.5
    assert final.value("teibatch_run_phase_seconds", phase="fleet_up") == 1.5
    assert final.value("teibatch_run_server_busy_ratio", server="http://127.0.0.1:8081") == 0.9
    assert final.value("teibatch_run_server_busy_ratio", server="http://127.0.0.1:8082/") == 0.6
    assert final.value("teibatch_run_server_errors", server="http://127.0.0.1:8081", kind="TeiOverloaded") == 2
    assert final.value("teibatch_run_server_mean_in_flight", server="http://127.0.0.1:8082/") is None
    assert final.value("teibatch_run_info", run_id="20250101T020000Z-abc123") == 1
    assert before <= (final.value(LAST_SUCCESS) or 0) <= time.time()
    assert final.value("teibatch_last_run_timestamp_seconds") == final.value(LAST_SUCCESS)
    labels = {ls for _, ls in final.samples()}
    assert all(("teibatch_job", "nightly-index") in ls for ls in labels), "every sample names the job"
    assert not any(secret in final.body for secret in ("hunter2", "admin", "s3cret"))


@pytest.mark.parametrize("status", [pytest.param(s, id=s) for s in ("incomplete", "failed", "interrupted")])
def test_a_run_not_done_pushes_no_success_timestamp(gateway: Gateway, status: str) -> None:
    drive(MetricsReporter("nightly-index", push_url=gateway.url, push_interval_s=60), status)
    assert gateway.pushes and all(p.method == "POST" for p in gateway.pushes)  # POST keeps an earlier success
    assert all(p.value(LAST_SUCCESS) is None for p in gateway.pushes)
    final = gateway.pushes[-1]
    assert final.value("teibatch_run_status", status=status) == 1
    assert final.value("teibatch_run_status", status="done") == 0
    assert final.value("teibatch_progress_shards_failed") == 1
    assert final.value("teibatch_last_run_timestamp_seconds") is not None


def test_job_names_with_slashes_and_gateway_credentials(gateway: Gateway, caplog: pytest.LogCaptureFixture) -> None:
    host = gateway.url.removeprefix("http://")
    reporter = MetricsReporter("team/index", push_url=f"http://pusher:p%40ss@{host}/", push_interval_s=60)
    assert reporter.destinations == [gateway.url]
    drive(reporter, advances=1)
    encoded = base64.urlsafe_b64encode(b"team/index").decode()
    assert {p.path for p in gateway.pushes} == {f"/metrics/job/teibatch/teibatch_job@base64/{encoded}"}
    expected = "Basic " + base64.b64encode(b"pusher:p@ss").decode()
    assert all(p.headers.get("Authorization") == expected for p in gateway.pushes)
    assert "p@ss" not in caplog.text


def test_progress_pushes_are_throttled(gateway: Gateway) -> None:
    reporter = MetricsReporter("nightly-index", push_url=gateway.url, push_interval_s=60)
    reporter.bind("r")
    reporter.start(500, 5000)
    for _ in range(500):
        reporter.advance(1, 10)
    assert len(gateway.pushes) == 1  # the start's; every advance came within the interval


def test_progress_pushes_at_most_once_per_interval(gateway: Gateway) -> None:
    interval = 0.1
    reporter = MetricsReporter("nightly-index", push_url=gateway.url, push_interval_s=interval)
    reporter.bind("r")
    started = time.monotonic()
    reporter.start(40, 400)
    for _ in range(40):
        reporter.advance(1, 10)
        time.sleep(0.01)
    elapsed = time.monotonic() - started
    assert 1 <= len(gateway.pushes) <= 2 + elapsed / interval
    assert gateway.pushes[-1].value("teibatch_progress_shards_done") is not None


def test_gateway_down_logs_one_warning_and_the_run_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    reporter = MetricsReporter("nightly-index", push_url=f"http://127.0.0.1:{closed_port()}", push_interval_s=0.01)
    with caplog.at_level(logging.DEBUG, logger="teibatch.metrics"):
        started = time.monotonic()
        reporter.bind("r")
        reporter.start(3, 30)
        for _ in range(3):
            time.sleep(0.02)
            reporter.advance(1, 10)
        reporter.finish(report())
    assert time.monotonic() - started < 10
    warnings = [r for r in caplog.records if r.name == "teibatch.metrics" and r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "127.0.0.1" in warnings[0].getMessage()
    assert reporter.publish() is False


def test_a_gateway_that_never_answers_costs_about_the_timeout(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as listener:  # accepts connections (the backlog) and never reads or answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        reporter = MetricsReporter("nightly-index", push_url=url, push_timeout_s=0.3)
        started = time.monotonic()
        drive(reporter, advances=3)
        elapsed = time.monotonic() - started
    assert elapsed < 5  # two pushes (start, finish) of at most ~0.3 s each, the advances in between none
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1


def test_textfile_is_written_whole_and_keeps_the_last_success(tmp_path: Path) -> None:
    path = tmp_path / "teibatch.prom"
    drive(MetricsReporter("nightly-index", textfile=str(path)))
    assert [p.name for p in tmp_path.iterdir()] == ["teibatch.prom"]  # atomic: no temporary file left
    first = Push("", "", path.read_text(), {})
    success = first.value(LAST_SUCCESS, teibatch_job="nightly-index")
    assert success is not None
    assert first.value("teibatch_run_documents", outcome="embedded") == 110

    drive(MetricsReporter("nightly-index", textfile=str(path)), status="failed")
    second = Push("", "", path.read_text(), {})
    assert second.value("teibatch_run_status", status="failed") == 1
    assert second.value(LAST_SUCCESS) == success  # a failed run does not hide the last good one
    assert (second.value("teibatch_last_run_timestamp_seconds") or 0) >= success
    assert [p.name for p in tmp_path.iterdir()] == ["teibatch.prom"]


def test_textfile_that_cannot_be_written_logs_one_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    reporter = MetricsReporter("nightly-index", textfile=str(tmp_path / "missing" / "teibatch.prom"))
    drive(reporter)
    assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 1
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(("url", "label"), [
    pytest.param("http://127.0.0.1:8080", "http://127.0.0.1:8080", id="plain"),
    pytest.param("https://user:pw@tei.example:443/v1?key=x#f", "https://tei.example:443/v1", id="credentials"),
    pytest.param("http://[::1]:9000/", "http://[::1]:9000/", id="ipv6"),
])
def test_servers_are_labelled_without_credentials(url: str, label: str) -> None:
    assert label_url(url) == label


@pytest.mark.parametrize("url", [pytest.param("ftp://host/x", id="scheme"), pytest.param("http://", id="no-host")])
def test_a_push_url_that_is_not_http_is_a_usage_error(url: str) -> None:
    with pytest.raises(JobSpecError, match="--metrics-push"):
        MetricsReporter("nightly-index", push_url=url)


@pytest.mark.usefixtures("ray_session")
def test_a_whole_run_pushes_its_real_counts(gateway: Gateway, small_corpus: Path, job_file: Callable[..., Path],
                                            tmp_path: Path) -> None:
    job = load_job(job_file({"path": str(small_corpus), "id_field": "id", "shard_docs": 10}))
    textfile = tmp_path / "metrics" / "teibatch.prom"
    textfile.parent.mkdir()
    summary = run_job(job, reporter=MetricsReporter(job.name, push_url=gateway.url, textfile=str(textfile)))
    assert summary.embedded == 40
    assert gateway.pushes and {p.path for p in gateway.pushes} == {"/metrics/job/teibatch/teibatch_job/test-job"}
    final = gateway.pushes[-1]
    assert final.value("teibatch_run_status", status="done") == 1
    assert final.value("teibatch_run_info", run_id=summary.run_id) == 1
    assert final.value("teibatch_run_documents", outcome="embedded") == 40
    assert final.value("teibatch_run_documents_read") == 40
    assert final.value("teibatch_run_shards", state="committed") == 5
    assert final.value("teibatch_progress_documents_done") == 40
    assert final.value(LAST_SUCCESS) is not None
    inputs = {dict(ls)["server"]: v for (n, ls), v in final.samples().items() if n == "teibatch_run_server_inputs"}
    assert set(inputs) == {label_url(url) for url in summary.servers} and len(inputs) == 2
    assert sum(inputs.values()) == 40
    assert Push("", "", textfile.read_text(), {}).samples().keys() == final.samples().keys()
