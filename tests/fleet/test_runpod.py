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

from teibatch.errors import CapacityUnavailable, JobSpecError
from teibatch.fleet import LaunchSpec, Ledger, running
from teibatch.fleet.offers import GpuWant
from teibatch.fleet.providers.runpod import RunPodApi, RunPodProvider
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
    assert create["gpuTypeIds"] == ["NVIDIA GeForce RTX 4090"]  # the cheapest allowed card
    assert create["imageName"] == "ghcr.io/huggingface/text-embeddings-inference:89-1.9"  # Ada Lovelace
    assert create["ports"] == ["80/tcp"] and create["dockerEntrypoint"] == ["timeout"]
    assert create["dockerStartCmd"][3:6] == ["/entrypoint.sh", "--model-id", MODEL]
    assert (create["networkVolumeId"], create["volumeMountPath"]) == ("vol-abc", "/data")  # the weights are kept
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
    fake_runpod.no_capacity.add("NVIDIA GeForce RTX 4090")
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


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_spot_job_rents_interruptible_pods_end_to_end(fake_runpod: FakeRunPod, tmp_path: Path,
                                                      ledger: Ledger) -> None:
    job = write_job(tmp_path)
    spec = yaml.safe_load(job.read_text())
    spec["servers"].update(capacity="spot", max_price=0.50)
    job.write_text(yaml.safe_dump(spec))
    summary = run_job(load_job(job))
    assert summary.embedded == 40 and summary.status == "done"
    assert fake_runpod.create_attempts == ["NVIDIA GeForce RTX 4090 (spot)"] * 2
    assert all(c["interruptible"] is True and c["dockerEntrypoint"] == ["timeout"] for c in fake_runpod.creates)
    assert len(fake_runpod.terminates) == 2 and fake_runpod.alive() == 0
    record = ledger.load(summary.run_id)
    assert record is not None and record["config"]["capacity"] == "spot"
    assert {e["offer"] for e in record["instances"].values()} == {"NVIDIA GeForce RTX 4090 (interruptible)"}
    assert {e["price_per_hour"] for e in record["instances"].values()} == {0.35}  # the secure cloud's spot price


@pytest.mark.timeout(60)
def test_spot_price_is_capped_by_max_price(fake_runpod: FakeRunPod, ledger: Ledger) -> None:
    # spot: RTX 4090 0.35, RTX A6000 0.39. The 4090's price rises to 0.45 between the query and the create.
    fake_runpod.spot_now["NVIDIA GeForce RTX 4090"] = 0.45
    spot = provider(ledger, capacity="spot", want=GpuWant(names=("RTX 4090", "A6000"), max_price=0.40))
    with running(spot, LaunchSpec(run_id="cap")) as endpoints:
        assert len(endpoints) == 1
    assert fake_runpod.create_attempts == ["NVIDIA GeForce RTX 4090 (spot)", "NVIDIA RTX A6000 (spot)"]
    assert len(fake_runpod.terminates) == 2 and fake_runpod.alive() == 0  # the 4090 at once, the A6000 at the end
    record = ledger.load("cap")
    assert record is not None and record["instances"]["teibatch-cap-0"]["price_per_hour"] == 0.39
    under = provider(ledger, capacity="spot", want=GpuWant(names=("RTX 4090", "A6000"), max_price=0.30))
    with (pytest.raises(CapacityUnavailable, match=r"no spot GPU .*over the price cap of \$0\.30/h"),
          running(under, LaunchSpec(run_id="under"))):
        pass
    assert len(fake_runpod.create_attempts) == 2 and fake_runpod.alive() == 0


@pytest.mark.timeout(60)
def test_any_rents_spot_first_and_falls_back_to_on_demand(fake_runpod: FakeRunPod, ledger: Ledger) -> None:
    with running(provider(ledger, capacity="any"), LaunchSpec(run_id="any1")):
        pass
    assert fake_runpod.create_attempts == ["NVIDIA GeForce RTX 4090 (spot)"]
    fake_runpod.no_spot.update({"NVIDIA GeForce RTX 4090", "NVIDIA RTX A6000"})  # "no capacity" for spot pods
    with running(provider(ledger, capacity="any"), LaunchSpec(run_id="any2")):
        pass
    assert fake_runpod.create_attempts[1:] == ["NVIDIA GeForce RTX 4090 (spot)", "NVIDIA RTX A6000 (spot)",
                                               "NVIDIA GeForce RTX 4090"]
    assert fake_runpod.creates[-1]["interruptible"] is False and fake_runpod.alive() == 0
    record = ledger.load("any2")
    assert record is not None and record["instances"]["teibatch-any2-0"]["price_per_hour"] == 0.69


def test_spot_is_a_valid_capacity_for_runpod_not_for_lambda(fake_runpod: FakeRunPod, tmp_path: Path) -> None:
    job = write_job(tmp_path)
    spec = yaml.safe_load(job.read_text())
    for capacity in ("spot", "any"):
        spec["servers"]["capacity"] = capacity
        job.write_text(yaml.safe_dump(spec))
        fleet_ = job_provider(load_job(job))
        assert isinstance(fleet_, RunPodProvider) and fleet_.capacity == capacity
    spec["servers"] = {"provider": "lambda", "ssh_key_name": "k", "gpu": ["A10"], "capacity": "spot"}
    job.write_text(yaml.safe_dump(spec))
    with pytest.raises(JobSpecError, match=r"servers\.capacity: spot: Lambda Cloud offers no spot"):
        load_job(job)
