"""``teibatch bench``: the grid, a run against simulated GPUs, the time bound, clean errors, job files, --save.

Every server is the built-in one on 127.0.0.1, started and stopped by its test; every run is bounded
by ``--max-settings`` and ``--seconds-per-setting`` (a few seconds each).
"""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml
from click.testing import CliRunner, Result

from teibatch.bench import TOKENS_FROM_SERVER, Setting, plan_grid
from teibatch.cli_bench import bench
from teibatch.cli_plan import _bench as plan_bench_value
from teibatch.cli_plan import plan
from teibatch.errors import EXIT_USAGE, TeiAuthError, TeiUnavailable, WrongModelKind
from teibatch.server import text_digest
from teibatch.server.testing import running_server, server_stats
from tests.conftest import write_jsonl

SMALL_GPU = {"simulate_gpu": 50_000, "max_client_batch_size": 16, "max_concurrent_requests": 64}
NO_VIOLATIONS = {"batch_size": 0, "payload": 0, "inflight": 0, "input_length": 0}


def invoke(*args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(bench, list(args), env=env)


def write_job(tmp_path: Path, servers: dict[str, Any], rows: int = 20) -> tuple[Path, list[str]]:
    texts = [f"corpus document {i} about topic {i % 7}, with a few more words in it" for i in range(rows)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", [{"id": f"d{i}", "text": t} for i, t in enumerate(texts)])
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "bench-test", "servers": servers,
                                   "corpus": {"path": str(tmp_path / "corpus"), "id_field": "id", "shard_docs": 10},
                                   "output": {"path": str(tmp_path / "out")}}))
    return job, texts


@pytest.mark.parametrize(("max_batch", "max_inflight", "max_settings"), [
    pytest.param(32, 512, 12, id="tei-defaults"),
    pytest.param(16, 64, 6, id="small-limits"),
    pytest.param(512, 512, 12, id="large-batches"),
    pytest.param(100, 300, 12, id="not-powers-of-two"),
    pytest.param(4, 2, 12, id="tiny-limits"),
    pytest.param(32, 512, 1, id="one-setting"),
    pytest.param(32, 512, 100, id="whole-grid"),
])
def test_grid_respects_info_limits_and_max_settings(max_batch: int, max_inflight: int, max_settings: int) -> None:
    grid = plan_grid(max_batch, max_inflight, max_settings)
    assert 1 <= len(grid) <= max_settings
    assert len(set(grid)) == len(grid) and grid == sorted(grid)
    assert all(s.batch_size <= max_batch and s.inputs_in_flight <= max_inflight for s in grid)
    # The ends are always measured: the largest batch allowed, at the most inputs in flight that fit.
    top = min(max_batch, max_inflight)
    assert grid[-1] == Setting(top, max_inflight // top)


def test_small_grid_is_spread_from_least_to_most() -> None:
    assert plan_grid(16, 64, 6) == [Setting(8, 1), Setting(8, 4), Setting(8, 8),
                                    Setting(16, 1), Setting(16, 2), Setting(16, 4)]
    assert len(plan_grid(32, 512, 100)) == 7 + 6 + 5  # batches 8, 16, 32; 1, 2, 4 ... requests each


@pytest.mark.slow  # measures every setting of the grid for a second
def test_two_simulated_gpus_json_chart_recommendation_and_plan(tmp_path: Path) -> None:
    chart, saved = tmp_path / "bench.html", tmp_path / "bench.json"
    with running_server(**SMALL_GPU) as a, running_server(**SMALL_GPU) as b:
        result = invoke("--urls", a, "--urls", b, "--words", "40", "--seconds-per-setting", "1",
                        "--max-settings", "6", "--chart", str(chart), "--save", str(saved), "--json")
        stats = [server_stats(url) for url in (a, b)]
    assert result.exit_code == 0, result.output
    assert all(s["violations"] == NO_VIOLATIONS for s in stats)  # the bench stayed within /info's limits
    assert re.search(r"batch\s+req/server\s+inputs/server\s+docs/s\s+tokens/s", result.stderr)  # the table
    report = orjson.loads(result.stdout)  # stdout holds the JSON and nothing else

    assert {"servers", "texts", "settings", "results", "best", "recommendation", "tokens_per_s",
            "tokens_per_s_per_server", "stopped_early", "stopped_reason", "seconds"} <= report.keys()
    assert [s["url"] for s in report["servers"]] == [a, b]
    assert report["texts"]["token_count"] == TOKENS_FROM_SERVER and report["texts"]["mean_tokens"] > 0
    settings = [(s["batch_size"], s["requests_in_flight"]) for s in report["settings"]]
    assert settings == [(8, 1), (8, 4), (8, 8), (16, 1), (16, 2), (16, 4)]
    assert [(r["batch_size"], r["requests_in_flight"]) for r in report["results"]] == settings
    assert report["stopped_early"] is False and report["stopped_reason"] is None
    for r in report["results"]:
        assert r["errors"] == {}, r
        assert r["documents_per_s"] > 0 and r["tokens_per_s"] > 0 and r["requests"] > 0
        assert 0 < r["latency_ms"]["p50"] <= r["latency_ms"]["p95"] <= r["latency_ms"]["p99"]
        assert [s["url"] for s in r["servers"]] == [a, b] and all(s["tokens_per_s"] > 0 for s in r["servers"])
        # Never more than the two simulated GPUs can give (plus a batch finishing early in the window).
        assert r["tokens_per_s"] < 1.2 * 2 * SMALL_GPU["simulate_gpu"]

    best = max(r["tokens_per_s"] for r in report["results"])
    assert report["best"]["tokens_per_s"] == best
    recommendation = report["recommendation"]
    chosen = recommendation["setting"]
    assert (chosen["batch_size"], chosen["requests_in_flight"]) in settings
    assert recommendation["client"] == {"max_batch_size": chosen["batch_size"],
                                        "max_inflight_inputs": chosen["inputs_in_flight"]}
    assert recommendation["tokens_per_s"] >= 0.95 * best
    assert all({"flag", "reason"} == f.keys() and f["flag"].startswith("--") for f in recommendation["server_flags"])
    assert report["tokens_per_s"] == pytest.approx(best / 2, rel=0.01)
    assert report["tokens_per_s_per_server"].keys() == {a, b}

    page = chart.read_text()
    assert page.count("<svg") == 1
    drawn = sorted(int(size) for size in re.findall(r'<path [^>]*data-batch-size="(\d+)"', page))
    assert drawn == [8, 16]  # one line per batch size
    lowered = page.lower()
    assert not any(ref in lowered for ref in ("<script", "src=", "href=", "url(", "@import", "<link"))

    saved_data = orjson.loads(saved.read_bytes())
    assert saved_data["tokens_per_s"] == report["tokens_per_s"]
    [(gpu, tokens_per_s, source)] = plan_bench_value((str(saved),)).figures
    assert (gpu, tokens_per_s) == ("", report["tokens_per_s"]) and source.startswith("bench.json, ")
    job, _ = write_job(tmp_path, {"provider": "local", "count": 1})
    planned = CliRunner().invoke(plan, [str(job), "--bench", str(saved)])
    assert planned.exit_code == 0, planned.output


def test_max_seconds_stops_mid_grid_and_says_so() -> None:
    with running_server(simulate_gpu=50_000) as url:  # TEI's default limits: a grid of 12 settings
        began = time.monotonic()
        result = invoke("--urls", url, "--words", "40", "--seconds-per-setting", "1", "--max-seconds", "3",
                        "--no-chart")
        took = time.monotonic() - began
    assert result.exit_code == 0, result.output
    assert took < 3 + 1.0
    stopped = re.search(r"stopped early: --max-seconds 3 reached after (\d+) of 12 settings", result.stdout)
    assert stopped, result.stdout
    measured = int(stopped.group(1))
    assert 1 <= measured < 12
    rows = [line for line in result.stdout.splitlines() if re.match(r"\s+\d+\s+\d+\s+\d+\s", line)]
    assert len(rows) == measured
    assert "max_batch_size:" in result.stdout and "max_inflight_inputs:" in result.stdout


def test_wrong_api_key_stops_cleanly_naming_the_variable() -> None:
    with running_server(api_key="the-right-key", simulate_gpu=50_000) as url:
        wrong = invoke("--urls", url, "--api-key-env", "BENCH_TEI_KEY", "--no-chart",
                       env={"BENCH_TEI_KEY": "a-wrong-key"})
        right = invoke("--urls", url, "--api-key-env", "BENCH_TEI_KEY", "--no-chart", "--max-settings", "1",
                       "--seconds-per-setting", "0.5", "--words", "20", "--json",
                       env={"BENCH_TEI_KEY": "the-right-key"})
        unset = invoke("--urls", url, "--api-key-env", "BENCH_TEI_KEY_UNSET", "--no-chart")
    assert wrong.exit_code == TeiAuthError.exit_code, wrong.output
    assert "BENCH_TEI_KEY" in wrong.stderr and "401" in wrong.stderr
    assert "Traceback" not in wrong.output and "a-wrong-key" not in wrong.output
    assert right.exit_code == 0, right.output
    assert "the-right-key" not in right.output
    assert orjson.loads(right.stdout)["texts"]["token_count"] == TOKENS_FROM_SERVER  # /tokenize got the key too
    assert unset.exit_code == EXIT_USAGE and "BENCH_TEI_KEY_UNSET is not set" in unset.stderr


def test_unreachable_url_is_a_clean_error() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    # The socket is closed: nothing listens on the port.
    result = invoke("--urls", f"http://127.0.0.1:{port}", "--no-chart")
    assert result.exit_code == TeiUnavailable.exit_code
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: http://127.0.0.1:{port}: connection failed") and "already run" in last
    assert "Traceback" not in result.output


def test_a_server_that_dies_mid_run_stops_the_bench_cleanly() -> None:
    with running_server(simulate_gpu=50_000, faults={"exit_after": 30}) as url:
        began = time.monotonic()
        result = invoke("--urls", url, "--words", "40", "--seconds-per-setting", "1", "--max-settings", "4",
                        "--no-chart")
        took = time.monotonic() - began
    assert result.exit_code == TeiUnavailable.exit_code, result.output
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {url}: connection failed")
    assert "Traceback" not in result.output and took < 10


def test_a_reranker_is_refused_before_measuring() -> None:
    with running_server(model_kind="reranker") as url:
        result = invoke("--urls", url, "--no-chart")
    assert result.exit_code == WrongModelKind.exit_code
    assert "not an embedding model" in result.stderr and "Traceback" not in result.output


def test_job_file_samples_its_corpus_across_shards(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    with running_server(simulate_gpu=50_000, max_client_batch_size=8, max_concurrent_requests=16,
                        record_texts=True) as url:
        job, texts = write_job(tmp_path, {"provider": "static", "urls": [url]}, rows=60)
        result = invoke(str(job), "--corpus-sample", "40", "--max-settings", "1", "--seconds-per-setting", "0.5",
                        "--json")
        embedded = set(server_stats(url)["texts"])
    assert (tmp_path / "teibatch-bench.html").is_file()  # the default chart, in the working folder
    assert result.exit_code == 0, result.output
    report = orjson.loads(result.stdout)
    assert report["texts"]["count"] == 40 and "sampled from the corpus" in report["texts"]["source"]
    assert embedded <= {text_digest(t) for t in texts}  # every text sent came from the corpus
    assert text_digest(texts[55]) in embedded  # from the last of 6 shards, not only the first 40 rows


def test_a_job_that_launches_its_own_servers_needs_urls(tmp_path: Path) -> None:
    job, _ = write_job(tmp_path, {"provider": "local", "count": 1})
    result = invoke(str(job), "--no-chart")
    assert result.exit_code == EXIT_USAGE
    assert "provider local" in result.stderr and "--urls" in result.stderr


@pytest.mark.parametrize(("args", "key"), [
    pytest.param([], "--urls", id="no-servers"),
    pytest.param(["--urls", "127.0.0.1:8080"], "--urls", id="not-a-url"),
    pytest.param(["--urls", "http://127.0.0.1:9", "--corpus-sample", "5"], "--corpus-sample",
                 id="sample-without-job"),
    pytest.param(["--urls", "http://127.0.0.1:9", "--max-seconds", "2", "--seconds-per-setting", "5"],
                 "--max-seconds", id="max-seconds-below-one-setting"),
])
def test_usage_errors_exit_2_before_any_work(args: list[str], key: str) -> None:
    began = time.monotonic()
    result = invoke(*args, "--no-chart")
    assert result.exit_code == EXIT_USAGE, result.output
    assert key in result.stderr and "Traceback" not in result.output
    assert time.monotonic() - began < 5
