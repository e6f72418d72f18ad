"""Provider runpod against a fake RunPod whose pods are real ``teibatch serve --api-key`` processes.

Every case ends with no pod alive in the fake and no pod process running; the full job also proves
that neither the RunPod API key nor the run's TEI key appears in anything written.
"""

from __future__ import annotations

import signal
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli import validate
from teibatch.errors import JobSpecError
from teibatch.fleet import LaunchSpec, Ledger, running
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.offers import GpuWant
from teibatch.fleet.providers.runpod import RunPodApi, RunPodProvider
from teibatch.fleet.rental import CloudState
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.run_fleet import job_provider
from tests.fleet.conftest import (
    RUNPOD_KEY,
    kill_when_ready,
    signal_after_first_commit,
    sweep_destroys_what_the_killed_run_left,
)
from tests.fleet.fake_runpod import FakeRunPod
from tests.fleet.test_lambda import _env
from tests.fleet.test_run_ssh import corpus, files_under

MODEL = "BAAI/bge-small-en-v1.5"
WAIT_S = 90.0


def write_job(tmp_path: Path, **sections: Any) -> Path:
    spec = {"name": "runpod-job", "corpus": {"path": str(corpus(tmp_path)), "id_field": "id", "shard_docs": 10},
            "model": {"id": MODEL},
            "servers": {"provider": "runpod", "count": 2, "gpu": ["RTX 4090", "A6000"], "startup_timeout": 30,
                        "network_volume_id": "vol-abc"},
            "output": {"path": str(tmp_path / "out")}, **sections}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def provider(ledger: Ledger, **options: Any) -> RunPodProvider:
    api = RunPodApi(timeout=options.pop("api_timeout", 5.0))
    settings = {"count": 1, "want": GpuWant(names=("RTX 4090", "A6000")), "startup_timeout": 20.0, **options}
    return RunPodProvider(api, model_id=MODEL, ledger=ledger, **settings)


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_full_job_rents_pods_embeds_and_terminates(fake_runpod: FakeRunPod, tmp_path: Path, ledger: Ledger,
                                                   caplog: pytest.LogCaptureFixture,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level("DEBUG")
    summary = run_job(load_job(write_job(tmp_path)))
    assert summary.embedded == 40 and summary.status == "done"
    assert fake_runpod.alive() == 0
    assert len(fake_runpod.creates) == 2 and len(fake_runpod.terminates) == 2
    create = fake_runpod.creates[0]
    assert create["gpu"] == {"id": "NVIDIA GeForce RTX 4090", "count": 1}  # the cheapest allowed card
    assert create["image"] == "ghcr.io/huggingface/text-embeddings-inference:89-1.9"  # Ada Lovelace
    assert create["ports"] == ["80/tcp"] and create["cloud"] == "SECURE"
    assert create["args"] == f"--model-id {MODEL}"  # for the image's own entrypoint: no override exists in v2
    assert create["mounts"] == {"network": [{"volumeId": "vol-abc", "path": "/data"}]}  # the weights are kept
    assert {path.split("/")[1] for _, path, _ in fake_runpod.requests} == {"v2"}  # REST v1 is retired
    assert fake_runpod.refused == [] and len(fake_runpod.answers) >= 6  # every request kept to RunPod's spec
    assert {c["name"] for c in fake_runpod.creates} == {f"teibatch-{summary.run_id}-{i}" for i in range(2)}
    tei_key = create["env"]["API_KEY"]
    assert len(tei_key) >= 32
    assert {e.state.value for e in ledger.entries()} == {"destroyed"}
    searched = files_under(tmp_path / "out", tmp_path / "state")
    assert len(searched) > 5
    for path in searched:
        data = path.read_bytes()
        assert RUNPOD_KEY.encode() not in data and tei_key.encode() not in data, f"a secret is in {path}"
    captured = capsys.readouterr()
    for text in (caplog.text, captured.out, captured.err, repr(job_provider(load_job(tmp_path / "job.yaml")))):
        assert RUNPOD_KEY not in text and tei_key not in text


@pytest.mark.timeout(60)
def test_public_port_needs_the_run_key_and_no_capacity_moves_to_the_next_card(fake_runpod: FakeRunPod,
                                                                                ledger: Ledger) -> None:
    fake_runpod.no_capacity.add("NVIDIA GeForce RTX 4090")  # a 400 problem+json: try the next candidate
    fleet_ = provider(ledger)
    with running(fleet_, LaunchSpec(run_id="cap")) as endpoints:
        [endpoint] = endpoints
        assert httpx.post(f"{endpoint.url}/embed", json={"inputs": "x"}, timeout=10).status_code == 401
        answer = httpx.post(f"{endpoint.url}/embed", json={"inputs": "x"}, timeout=10,
                            headers={"Authorization": f"Bearer {endpoint.api_key}"})
        assert answer.status_code == 200
    assert fake_runpod.create_attempts == ["NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"]
    assert fake_runpod.alive() == 0


@pytest.mark.timeout(60)
def test_pod_that_never_starts_is_terminated_and_replaced(fake_runpod: FakeRunPod, ledger: Ledger) -> None:
    fake_runpod.stuck = 1
    with running(provider(ledger, startup_timeout=6.0), LaunchSpec(run_id="stuck")) as endpoints:
        assert len(endpoints) == 1
        assert len(fake_runpod.creates) == 2 and len(fake_runpod.terminates) == 1
    assert fake_runpod.alive() == 0
    record = ledger.load("stuck")
    assert record is not None and "not running" in record["instances"]["teibatch-stuck-0"]["error"]


@pytest.mark.timeout(60)
def test_create_timeout_after_the_pod_was_made_adopts_it(fake_runpod: FakeRunPod, ledger: Ledger) -> None:
    fake_runpod.slow_creates, fake_runpod.create_delay_s = 1, 3.0
    with running(provider(ledger, api_timeout=1.0), LaunchSpec(run_id="slow")) as endpoints:
        assert len(endpoints) == 1
    assert len(fake_runpod.creates) == 1
    assert fake_runpod.alive() == 0


def test_job_without_a_network_volume_must_waive_the_export(fake_runpod: FakeRunPod, tmp_path: Path) -> None:
    job = write_job(tmp_path)
    spec = yaml.safe_load(job.read_text())
    del spec["servers"]["network_volume_id"]
    job.write_text(yaml.safe_dump(spec))
    with pytest.raises(JobSpecError, match=r"network_volume_id.*export\.waive"):
        job_provider(load_job(job))
    spec["export"] = {"waive": True}
    job.write_text(yaml.safe_dump(spec))
    assert isinstance(job_provider(load_job(job)), RunPodProvider)


@pytest.mark.timeout(150)
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, id="SIGTERM"),
                                    pytest.param(signal.SIGINT, id="SIGINT")])
def test_signal_mid_run_terminates_every_pod(fake_runpod: FakeRunPod, tmp_path: Path, signum: int) -> None:
    job = write_job(tmp_path, limits={"max_shards_in_flight": 1})
    spec = yaml.safe_load(job.read_text())
    spec["servers"]["server_args"] = ["--simulate-gpu", "60", "--batch-overhead-s", "0.3"]
    job.write_text(yaml.safe_dump(spec))

    def both_pods_up() -> None:
        assert fake_runpod.alive() == 4  # two pods, two processes

    code, stderr = signal_after_first_commit(job, tmp_path, _env(tmp_path), signum, both_pods_up, WAIT_S)
    assert code == 1, stderr.decode()[-2000:]
    assert b"interrupted" in stderr and RUNPOD_KEY.encode() not in stderr
    assert fake_runpod.alive() == 0


@pytest.mark.timeout(120)
def test_sigkill_then_fleet_sweep_terminates_the_pods(fake_runpod: FakeRunPod, tmp_path: Path,
                                                      ledger: Ledger) -> None:
    script = (
        "import time\n"
        "from teibatch.fleet import running, LaunchSpec\n"
        "from teibatch.fleet.providers.runpod import RunPodApi, RunPodProvider\n"
        "from teibatch.fleet.offers import GpuWant\n"
        "fleet = RunPodProvider(RunPodApi(), count=1, want=GpuWant(names=('RTX 4090',)),"
        " model_id='BAAI/bge-small-en-v1.5', startup_timeout=30)\n"
        "with running(fleet, LaunchSpec(run_id='killed')):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n")
    kill_when_ready([sys.executable, "-c", script], _env(tmp_path))
    assert fake_runpod.alive() == 2  # the pod and its process outlive the driver
    sweep_destroys_what_the_killed_run_left(fake_runpod.alive, "teibatch-killed-0")


def test_catalog_offers_the_cards_in_stock_in_the_jobs_cloud(fake_runpod: FakeRunPod) -> None:
    api = RunPodApi(cloud_type="COMMUNITY")
    offers = {o.key: o.price_per_hour for o in api.offers()}
    # the H100 has no pods in stock (availability NONE); prices are the community cloud's
    assert offers == {"NVIDIA GeForce RTX 4090": 0.34, "NVIDIA RTX A6000": 0.49, "Tesla V100-SXM2-16GB": 0.19}
    [(method, path, _)] = fake_runpod.requests
    assert (method, path) == ("GET", "/v2/catalog/gpus") and fake_runpod.refused == []
    assert billing_rules()["runpod"].increment_s == 1  # RunPod bills pods by the second


def test_list_finds_the_runs_pods_by_name_prefix(fake_runpod: FakeRunPod) -> None:
    api = RunPodApi()
    made = [api.create({"name": name, "image": "img", "gpu": {"id": "NVIDIA RTX A6000", "count": 1},
                        "env": {"API_KEY": "k"}, "args": "--model-id m", "ports": ["80/tcp"]})
            for name in ("teibatch-r1-0", "teibatch-r1-1", "teibatch-r2-0")]
    assert {i.name for i in api.list("teibatch-r1-")} == {"teibatch-r1-0", "teibatch-r1-1"}
    api.terminate(made[0].id)
    assert [i.name for i in api.list("teibatch-r1-")] == ["teibatch-r1-1"]
    api.terminate(made[0].id)  # already gone: a 404, counted as terminated
    for pod in made[1:]:
        api.terminate(pod.id)
    assert fake_runpod.alive() == 0 and fake_runpod.refused == []


@pytest.mark.parametrize("capacity", [pytest.param("spot", id="spot"), pytest.param("any", id="any")])
def test_spot_is_refused_for_runpod_naming_the_providers_that_rent_it(tmp_path: Path, capacity: str) -> None:
    job = write_job(tmp_path)
    spec = yaml.safe_load(job.read_text())
    spec["servers"]["capacity"] = capacity
    job.write_text(yaml.safe_dump(spec))
    with pytest.raises(JobSpecError, match=rf"servers\.capacity: {capacity}: RunPod \(API v2\) offers no spot "
                                           r"\(interruptible\) capacity; use capacity: on-demand, or provider vast"):
        load_job(job)
    result = CliRunner().invoke(validate, [str(job)])
    assert result.exit_code == 2, result.output


def test_cloud_all_is_refused_at_validation(tmp_path: Path) -> None:
    job = write_job(tmp_path)
    spec = yaml.safe_load(job.read_text())
    spec["servers"]["cloud_type"] = "ALL"
    job.write_text(yaml.safe_dump(spec))
    result = CliRunner().invoke(validate, [str(job)])
    assert result.exit_code == 2, result.output
    for words in ("servers.cloud_type", str(job), "'SECURE'", "'COMMUNITY'"):
        assert words in result.output, result.output


def _raw_create(fake: FakeRunPod, **fields: Any) -> httpx.Response:
    body = {"name": "teibatch-raw-0", "image": "img", "gpu": {"id": "NVIDIA RTX A6000", "count": 1}, **fields}
    return httpx.post(f"{fake.rest_url}/pods", json={k: v for k, v in body.items() if v is not None}, timeout=10,
                      headers={"Authorization": f"Bearer {RUNPOD_KEY}"})


@pytest.mark.parametrize(("fields", "named"), [
    pytest.param({"cloudType": "ALL"}, "additional properties 'cloudType' not allowed", id="v1-cloudType-ALL"),
    pytest.param({"bogus": 1}, "additional properties 'bogus' not allowed", id="unknown-field"),
    pytest.param({"cloud": "ALL"}, "$.cloud: 'ALL' is not one of ['SECURE', 'COMMUNITY']", id="wrong-enum"),
    pytest.param({"name": None}, "'name' is a required property", id="missing-required"),
    pytest.param({"dockerEntrypoint": ["timeout"]}, "'dockerEntrypoint' not allowed", id="no-entrypoint-override"),
])
def test_spec_check_bites(fake_runpod: FakeRunPod, fields: dict[str, Any], named: str) -> None:
    answer = _raw_create(fake_runpod, **fields)
    assert answer.status_code == 422 and answer.headers["content-type"] == "application/problem+json"
    body = answer.json()
    assert body["title"] == "Unprocessable Entity" and any(named in line for line in body["errors"]), body
    assert fake_runpod.creates == [] and fake_runpod.alive() == 0
    assert _raw_create(fake_runpod).status_code == 201  # the same request within the spec is served
    for pod in fake_runpod.serving() or list(fake_runpod.pods):
        httpx.delete(f"{fake_runpod.rest_url}/pods/{pod}", headers={"Authorization": f"Bearer {RUNPOD_KEY}"})
    v1 = httpx.get(f"{fake_runpod.url}/v1/pods", headers={"Authorization": f"Bearer {RUNPOD_KEY}"}, timeout=10)
    assert v1.status_code == 404  # REST v1 is retired


def test_rate_limit_answers_429_with_retry_after_within_the_spec(fake_runpod: FakeRunPod) -> None:
    fake_runpod.rate_limit, fake_runpod.rate_window_s = 2, 30.0
    auth = {"Authorization": f"Bearer {RUNPOD_KEY}"}
    answers = [httpx.get(f"{fake_runpod.rest_url}/pods", headers=auth, timeout=10) for _ in range(3)]
    assert [a.status_code for a in answers] == [200, 200, 429]
    assert 1 <= int(answers[2].headers["Retry-After"]) <= 30 and answers[2].json()["status"] == 429
    assert fake_runpod.throttled == 1 and fake_runpod.answer_problems == []


def test_late_visibility_leaves_a_new_pod_out_of_lists(fake_runpod: FakeRunPod) -> None:
    fake_runpod.late_polls = 2
    api = RunPodApi()
    pod = api.create({"name": "teibatch-late-0", "image": "img", "gpu": {"id": "NVIDIA RTX A6000", "count": 1},
                      "env": {"API_KEY": "k"}, "args": "--model-id m", "ports": ["80/tcp"]})
    assert pod.state is CloudState.PENDING and pod.status == "PROVISIONING"
    seen = [len(api.list("teibatch-late-")) for _ in range(3)]
    assert seen == [0, 0, 1]  # two lists after the create answered, it shows up
    api.terminate(pod.id)
    assert fake_runpod.alive() == 0


def test_pod_action_stop_and_terminate_follow_the_pods_actions(fake_runpod: FakeRunPod) -> None:
    api = RunPodApi()
    pod = api.create({"name": "teibatch-act-0", "image": "img", "gpu": {"id": "NVIDIA RTX A6000", "count": 1},
                      "env": {"API_KEY": "k"}, "args": "--model-id m", "ports": ["80/tcp"]})
    auth = {"Authorization": f"Bearer {RUNPOD_KEY}"}
    url = f"{fake_runpod.rest_url}/pods/{pod.id}/action"
    assert httpx.post(url, json={"action": "restart"}, headers=auth, timeout=10).status_code == 409  # PROVISIONING
    assert httpx.post(url, json={"action": "stop"}, headers=auth, timeout=10).json()["status"] == "EXITED"
    seen = api.get(pod.id)
    assert seen is not None and seen.state is CloudState.FAILED
    assert httpx.post(url, json={"action": "terminate"}, headers=auth, timeout=10).status_code == 204
    assert api.get(pod.id) is None and fake_runpod.alive() == 0


def test_the_providers_create_body_keeps_to_the_spec(fake_runpod: FakeRunPod, ledger: Ledger) -> None:
    fleet_ = RunPodProvider(RunPodApi(cloud_type="COMMUNITY"), count=1, want=GpuWant(regions=("EU-RO-1",)),
                            model_id=MODEL, server_args=("--max-batch-tokens", "16384"), ledger=ledger,
                            network_volume_id="vol-abc")
    [offer] = [o for o in fleet_.api.offers() if o.key == "NVIDIA RTX A6000"]
    body = fleet_.pod_request("teibatch-body-0", offer)
    assert fake_runpod.spec is not None
    found = fake_runpod.spec.find("POST", "/v2/pods")
    assert found is not None and found[0].name == "createPod"
    assert fake_runpod.spec.request_problems(found[0], {}, {}, body) == []
    assert body["cloud"] == "COMMUNITY" and body["dataCenterIds"] == ["EU-RO-1"]
    assert body["args"] == f"--model-id {MODEL} --max-batch-tokens 16384"
    bad = {**body, "cloudType": "ALL"}  # what REST v1 took: refused by name
    assert fake_runpod.spec.request_problems(found[0], {}, {}, bad) == [
        "$: additional properties 'cloudType' not allowed"]


def test_answer_check_bites(fake_runpod: FakeRunPod) -> None:
    spec = fake_runpod.spec
    assert spec is not None
    found = spec.find("GET", "/v2/pods/abc")
    assert found is not None
    v1_pod = {"id": "abc", "name": "teibatch-x-0", "desiredStatus": "RUNNING", "costPerHr": "0.69"}  # REST v1's shape
    problems = spec.response_problems(found[0], 200, v1_pod, "application/json")
    assert "answer 200 $: 'status' is a required property" in problems
    assert spec.response_problems(found[0], 404, {"error": "pod not found"}, "application/json") == [
        "getPod 404: media type application/json is not one of ['application/problem+json']"]
    assert fake_runpod.answers == []  # nothing was sent: the fixture checks every answer that is
