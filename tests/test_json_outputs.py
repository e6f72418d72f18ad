"""Machine-readable output: JSON log lines that each parse and carry the run id, and every ``--json``
output valid against its documented schema (``docs/json/``)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import orjson
import pytest
import ray
import yaml

from teibatch.fleet.base import InstanceState
from teibatch.fleet.ledger import Ledger
from tests.conftest import write_jsonl

SCHEMAS = Path(__file__).resolve().parents[1] / "docs" / "json"


@pytest.fixture(scope="module")
def ray_address(ray_session: None) -> Iterator[str]:
    yield ray.get_runtime_context().gcs_address


def check(document: Any, schema: str) -> None:
    jsonschema.validate(document, orjson.loads((SCHEMAS / f"{schema}.schema.json").read_bytes()))


def teibatch(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "teibatch", *args], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=180, check=False)


def job(tmp_path: Path, servers: dict[str, Any] | None = None) -> Path:
    corpus = tmp_path / "corpus"
    write_jsonl(corpus / "a.jsonl", [{"id": f"d{i}", "text": f"text number {i}"} for i in range(40)]
                + [{"id": "empty", "text": ""}])
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "name": "json-test", "corpus": {"path": str(corpus), "id_field": "id", "shard_docs": 10},
        "servers": servers or {"provider": "local", "count": 1}, "output": {"path": str(tmp_path / "out")}}))
    return path


@pytest.mark.timeout(300)
def test_json_logs_and_the_report_on_stdout(tmp_path: Path, ray_address: str) -> None:
    done = teibatch("run", str(job(tmp_path)), "--log-format", "json", "--json", "--ray-address", ray_address)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)  # stdout holds the report and nothing else
    check(report, "run-report")
    assert report["status"] == "done" and report["documents"]["embedded"] == 40
    lines = [orjson.loads(line) for line in done.stderr.splitlines()]  # every line parses alone
    assert lines and all(line["run_id"] == report["run_id"] for line in lines)
    assert all({"time", "level", "event"} <= line.keys() for line in lines)
    events = [line["event"] for line in lines]
    assert events[-1] == "run_finished" and "embedding_started" in events
    finished = [line for line in lines if line["event"] == "shard_finished"]
    assert sorted(line["shard"] for line in finished) == sorted(p["shard"] for p in report["progress"])
    assert finished[-1]["documents_done"] == finished[-1]["documents_total"] == 41
    # The same events are in the report's timeline, with the same shards.
    assert report["progress"][-1]["shards"] == report["shards"]["committed"] == 5
    assert [e["event"] for e in report["events"]] == [line["event"] for line in lines if "message" in line]


@pytest.mark.timeout(300)
def test_a_run_that_does_not_finish_still_reports_as_json(tmp_path: Path, ray_address: str) -> None:
    servers = {"provider": "static", "urls": ["http://127.0.0.1:9"], "startup_timeout": 1}
    done = teibatch("run", str(job(tmp_path, servers)), "--log-format", "json", "--json", "--ray-address",
                    ray_address)
    assert done.returncode == 1, done.stderr
    report = orjson.loads(done.stdout)
    check(report, "run-report")
    assert report["status"] in {"incomplete", "failed"}
    last = orjson.loads(done.stderr.splitlines()[-1])
    assert last["event"] == "error" and last["exit_code"] == 1 and last["run_id"] == report["run_id"]
    assert all(orjson.loads(line)["run_id"] == report["run_id"] for line in done.stderr.splitlines())


@pytest.mark.timeout(300)
def test_status_plan_gpus_and_fleet_list_match_their_schemas(tmp_path: Path, ray_address: str) -> None:
    path = job(tmp_path)
    assert teibatch("run", str(path), "-q", "--ray-address", ray_address).returncode == 0
    status = teibatch("status", str(tmp_path / "out"), "--json")
    check(orjson.loads(status.stdout), "status")
    plan = teibatch("plan", str(path), "--json")
    check(orjson.loads(plan.stdout), "plan")
    gpus = teibatch("gpus", "--json")
    check(orjson.loads(gpus.stdout), "gpus")
    state = tmp_path / "state"
    ledger = Ledger(state / "ledger")
    ledger.begin("run-1", provider="ssh", job="j", config={}, export_to=None)
    ledger.update("run-1", "teibatch-run-1-0", InstanceState.RUNNING, host="127.0.0.1")
    listed = teibatch("fleet", "list", "--all", "--json", "--state-dir", str(state))
    assert listed.returncode == 0, listed.stderr
    entries = orjson.loads(listed.stdout)
    check(entries, "fleet-list")
    assert [e["instance"] for e in entries] == ["teibatch-run-1-0"]


@pytest.mark.timeout(300)
def test_the_run_command_writes_its_metrics_textfile(tmp_path: Path, ray_address: str) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    textfile = tmp_path / "metrics" / "teibatch.prom"
    textfile.parent.mkdir()
    done = teibatch("run", str(job(tmp_path)), "-q", "--metrics-textfile", str(textfile), "--ray-address",
                    ray_address)
    assert done.returncode == 0, done.stderr
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for family in text_string_to_metric_families(textfile.read_text()) for s in family.samples}
    assert samples[("teibatch_run_documents", (("outcome", "embedded"), ("teibatch_job", "json-test")))] == 40
    assert ("teibatch_last_success_timestamp_seconds", (("teibatch_job", "json-test"),)) in samples


@pytest.mark.timeout(120)
def test_bench_json_matches_its_schema(tmp_path: Path) -> None:
    from teibatch.server.testing import running_server

    with running_server(max_client_batch_size=8, max_concurrent_requests=16, simulate_gpu=50_000) as url:
        done = teibatch("bench", "--urls", url, "--words", "20", "--max-settings", "2", "--seconds-per-setting", "1",
                        "--no-chart", "--json")
    assert done.returncode == 0, done.stderr
    check(orjson.loads(done.stdout), "bench")
