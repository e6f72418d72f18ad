"""Provider lambda against a fake Lambda Cloud API whose instances are the test sshd (stand-in docker).

Every case ends with no instance alive in the fake and no stand-in container running; the full job
also proves that neither the Lambda API key nor the run's TEI key appears in anything written.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli_fleet import fleet
from teibatch.errors import CapacityUnavailable, JobSpecError
from teibatch.fleet import ExportPlan, LaunchSpec, Ledger, session
from teibatch.fleet.base import InstanceState
from teibatch.fleet.offers import GpuWant
from teibatch.fleet.providers.lambdacloud import LambdaApi, LambdaProvider
from teibatch.fleet.shell import SshLogin
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.run_fleet import job_provider
from tests.fleet.conftest import LAMBDA_KEY, SshHostFixture, kill_when_ready, signal_after_first_commit
from tests.fleet.fake_lambda import FakeLambda
from tests.fleet.test_run_ssh import REPO, corpus, files_under

MODEL = "BAAI/bge-small-en-v1.5"
WAIT_S = 90.0


def servers(host: SshHostFixture, tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {"provider": "lambda", "count": 1, "gpu": "A10", "startup_timeout": 30, "ssh_key_name": "ci-key",
            "key_file": str(host.key_file), "ssh_user": host.user, "ssh_port": host.port,
            "volume": str(tmp_path / "volume"), **extra}


def write_job(tmp_path: Path, host: SshHostFixture, **sections: Any) -> Path:
    spec = {"name": "lambda-job", "corpus": {"path": str(corpus(tmp_path)), "id_field": "id", "shard_docs": 10},
            "model": {"id": MODEL}, "servers": servers(host, tmp_path), "export": {"to": str(tmp_path / "exports")},
            "output": {"path": str(tmp_path / "out")}, **sections}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def provider(host: SshHostFixture, ledger: Ledger, tmp_path: Path, **options: Any) -> LambdaProvider:
    settings = {"count": 1, "want": GpuWant(names=("A10",)), "startup_timeout": 20.0, **options}
    return LambdaProvider(LambdaApi(timeout=options.pop("api_timeout", 5.0)), ssh_key_name="ci-key",
                          login=SshLogin(user=host.user, port=host.port, key_file=str(host.key_file)),
                          model_id=MODEL, volume=str(tmp_path / "volume"), ledger=ledger,
                          **{k: v for k, v in settings.items() if k != "api_timeout"})


def settled(fake: FakeLambda, host: SshHostFixture) -> None:
    assert fake.alive() == 0
    assert host.standin.running() == 0


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_full_job_rents_embeds_exports_and_gives_back(fake_lambda: FakeLambda, host: SshHostFixture, tmp_path: Path,
                                                      ledger: Ledger, caplog: pytest.LogCaptureFixture,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level("DEBUG")
    summary = run_job(load_job(write_job(tmp_path, host)))
    assert summary.embedded == 40 and summary.status == "done"
    settled(fake_lambda, host)
    [create] = fake_lambda.creates
    assert create == {"region_name": "us-east-1", "instance_type_name": "gpu_1x_a10", "ssh_key_names": ["ci-key"],
                      "quantity": 1, "name": f"teibatch-{summary.run_id}-0"}
    assert len(fake_lambda.terminates) == 1
    [run] = host.standin.runs()
    assert "ghcr.io/huggingface/text-embeddings-inference:86-1.9" in run  # the A10 is Ampere 8.6
    assert run[run.index("--entrypoint") + 1] == "timeout"  # the host-side deadline
    name = f"teibatch-{summary.run_id}-0"
    assert (tmp_path / "exports" / name / "_export.json").exists()
    record = ledger.load(summary.run_id)
    assert record is not None and record["provider"] == "lambda"
    entry = record["instances"][name]
    assert entry["state"] == "destroyed" and entry["cloud_id"] == fake_lambda.terminates[0]
    assert next(s["state"] for s in entry["steps"]) == "requested"
    # The report says what the card cost: the quoted price, for its time rounded up to Lambda's minute.
    cost = summary.to_json()["cost"]
    [card] = cost["instances"]
    assert card["name"] == name and card["price_per_hour"] == entry["price_per_hour"] > 0
    assert card["billed_seconds"] >= 60 and card["billed_seconds"] % 60 == 0
    assert cost["total"] == pytest.approx(card["price_per_hour"] * card["billed_seconds"] / 3600, abs=1e-4)
    # ...and the timeline of the card, from the ledger, among the run's events.
    steps = [e for e in summary.to_json()["events"] if e.get("instance") == name]
    assert [e["event"] for e in steps] == [f"instance_{s['state']}" for s in entry["steps"]]
    assert steps[0]["event"] == "instance_requested" and steps[-1]["event"] == "instance_destroyed"
    assert all(-1 <= e["t"] <= summary.timings["total_s"] + 1 for e in steps)
    # No secret anywhere: the cloud's key, the run's TEI key, the SSH private key.
    tei_key = host.standin.api_key()
    assert tei_key
    needles = [LAMBDA_KEY.encode(), tei_key.encode(), host.key_file.read_bytes()]
    searched = files_under(tmp_path / "out", tmp_path / "state", tmp_path / "exports", host.standin.root)
    searched = [p for p in searched if "witness" not in p.parts]
    assert len(searched) > 10
    for path in searched:
        data = path.read_bytes()
        assert not any(needle in data for needle in needles), f"a secret is in {path}"
    captured = capsys.readouterr()
    for text in (caplog.text, captured.out, captured.err, repr(job_provider(load_job(tmp_path / "job.yaml")))):
        assert LAMBDA_KEY not in text and tei_key not in text


@pytest.mark.timeout(60)
def test_no_capacity_in_the_first_region_moves_on(fake_lambda: FakeLambda, host: SshHostFixture, tmp_path: Path,
                                                  ledger: Ledger) -> None:
    fake_lambda.no_capacity.add(("gpu_1x_a10", "us-east-1"))
    fleet = provider(host, ledger, tmp_path, want=GpuWant(names=("A10",), regions=("us-east-1", "us-west-1")))
    fake_lambda.types["gpu_1x_a10"]["regions"] = ["us-east-1", "us-west-1"]
    with session(fleet, LaunchSpec(run_id="cap"), ExportPlan(waive=True)) as endpoints:
        assert len(endpoints) == 1
    # The instance-types answer already left us-east-1 out; a launch there would have been refused.
    assert [(c["instance_type_name"], c["region_name"]) for c in fake_lambda.creates] == [("gpu_1x_a10", "us-west-1")]
    settled(fake_lambda, host)


@pytest.mark.timeout(60)
def test_capacity_gone_between_listing_and_launch(fake_lambda: FakeLambda, host: SshHostFixture, tmp_path: Path,
                                                  ledger: Ledger, monkeypatch: pytest.MonkeyPatch) -> None:
    listed = LambdaApi.offers

    def offers_then_gone(self: LambdaApi) -> Any:
        offers = listed(self)
        fake_lambda.no_capacity.add(("gpu_1x_a10", "us-east-1"))  # the offer is gone by the time we launch
        return offers

    monkeypatch.setattr(LambdaApi, "offers", offers_then_gone)
    fleet = provider(host, ledger, tmp_path)
    with session(fleet, LaunchSpec(run_id="gone"), ExportPlan(waive=True)) as endpoints:
        assert len(endpoints) == 1
    assert fake_lambda.launch_attempts == [("gpu_1x_a10", "us-east-1"), ("gpu_1x_a10", "us-west-1")]
    assert len(fake_lambda.creates) == 1
    settled(fake_lambda, host)


@pytest.mark.timeout(60)
def test_instance_stuck_booting_is_terminated_and_replaced(fake_lambda: FakeLambda, host: SshHostFixture,
                                                           tmp_path: Path, ledger: Ledger) -> None:
    fake_lambda.stuck = 1
    fleet = provider(host, ledger, tmp_path, startup_timeout=15.0)
    with session(fleet, LaunchSpec(run_id="stuck"), ExportPlan(waive=True)) as endpoints:
        assert len(endpoints) == 1
        assert len(fake_lambda.creates) == 2 and len(fake_lambda.terminates) == 1  # the stuck one went at once
    names = [c["name"] for c in fake_lambda.creates]
    assert names == ["teibatch-stuck-0", "teibatch-stuck-1"]
    record = ledger.load("stuck")
    assert record is not None and "not active" in record["instances"]["teibatch-stuck-0"]["error"]
    settled(fake_lambda, host)


@pytest.mark.timeout(60)
def test_never_healthy_beyond_the_replacements_is_capacity_unavailable(fake_lambda: FakeLambda,
                                                                       host: SshHostFixture, tmp_path: Path,
                                                                       ledger: Ledger) -> None:
    fake_lambda.stuck = 5
    fleet = provider(host, ledger, tmp_path, startup_timeout=1.5, max_replacements=1)
    with pytest.raises(CapacityUnavailable, match=r"never became healthy.*max_replacements: 1"), \
            session(fleet, LaunchSpec(run_id="hopeless"), ExportPlan(waive=True)):
        pass
    assert len(fake_lambda.creates) == 2
    settled(fake_lambda, host)
    assert {e.state for e in ledger.entries()} == {InstanceState.DESTROYED}


@pytest.mark.timeout(60)
def test_create_call_timing_out_after_the_instance_was_made_adopts_it(fake_lambda: FakeLambda,
                                                                       host: SshHostFixture, tmp_path: Path,
                                                                       ledger: Ledger) -> None:
    fake_lambda.slow_launches, fake_lambda.launch_delay_s = 1, 3.0
    fleet = provider(host, ledger, tmp_path, api_timeout=1.0)
    with session(fleet, LaunchSpec(run_id="slow"), ExportPlan(waive=True)) as endpoints:
        assert len(endpoints) == 1
    assert len(fake_lambda.creates) == 1  # adopted by name, not launched twice
    record = ledger.load("slow")
    assert record is not None and record["instances"]["teibatch-slow-0"]["cloud_id"] == fake_lambda.terminates[0]
    settled(fake_lambda, host)


def test_credentials_come_from_the_environment_or_the_lambda_keys_file(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("LAMBDA_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(JobSpecError, match=r"LAMBDA_API_KEY.*lambda_keys"):
        LambdaApi(base_url="http://127.0.0.1:1")
    (tmp_path / ".lambda_cloud").mkdir()
    (tmp_path / ".lambda_cloud" / "lambda_keys").write_text("api_key = secret_from_file\n")
    api = LambdaApi(base_url="http://127.0.0.1:1")
    assert "secret_from_file" not in repr(api) and "secret_from_file" not in repr(api._client)
    api.close()


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TEIBATCH_STATE_DIR": str(tmp_path / "state"), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0",
            # this checkout's source first, whatever teibatch the environment has installed
            "PYTHONPATH": os.pathsep.join([str(REPO / "src"), str(REPO)])}


@pytest.mark.timeout(150)
@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, id="SIGTERM"),
                                    pytest.param(signal.SIGINT, id="SIGINT")])
def test_signal_mid_run_gives_everything_back(fake_lambda: FakeLambda, host: SshHostFixture, tmp_path: Path,
                                              signum: int) -> None:
    job = write_job(tmp_path, host, limits={"max_shards_in_flight": 1})
    spec = yaml.safe_load(job.read_text())
    spec["servers"]["server_args"] = ["--simulate-gpu", "60", "--batch-overhead-s", "0.3"]
    job.write_text(yaml.safe_dump(spec))

    def one_vm_up() -> None:
        assert fake_lambda.alive() == 1

    code, stderr = signal_after_first_commit(job, tmp_path, _env(tmp_path), signum, one_vm_up, WAIT_S)
    assert code == 1, stderr.decode()[-2000:]
    assert b"interrupted" in stderr and LAMBDA_KEY.encode() not in stderr
    settled(fake_lambda, host)
    assert (tmp_path / "exports").exists()  # exported before the VM went


@pytest.mark.timeout(150)
def test_sigkill_then_fleet_sweep_finds_and_destroys_everything(fake_lambda: FakeLambda, host: SshHostFixture,
                                                                 tmp_path: Path, ledger: Ledger) -> None:
    script = (
        "import sys, json, time\n"
        "from teibatch.fleet import session, LaunchSpec, ExportPlan\n"
        "from teibatch.fleet.providers.lambdacloud import LambdaApi, LambdaProvider\n"
        "from teibatch.fleet.shell import SshLogin\n"
        "from teibatch.fleet.offers import GpuWant\n"
        "login, volume, to = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
        "fleet = LambdaProvider(LambdaApi(), count=1, want=GpuWant(names=('A10',)), ssh_key_name='ci-key',"
        " login=SshLogin(**login), model_id='BAAI/bge-small-en-v1.5', volume=volume, startup_timeout=30)\n"
        "with session(fleet, LaunchSpec(run_id='killed', export_to=to), ExportPlan(to=to)):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n")
    login = json.dumps({"user": host.user, "port": host.port, "key_file": str(host.key_file)})
    kill_when_ready([sys.executable, "-c", script, login, str(tmp_path / "volume"), str(tmp_path / "exports")],
                    _env(tmp_path))
    assert fake_lambda.alive() == 1 and host.standin.running() == 1  # the driver is gone, its rental is not
    # An instance the ledger never heard of (its create call "timed out"): found by name in the cloud.
    orphan = LambdaApi().launch("teibatch-killed-7", next(o for o in LambdaApi().offers() if o.key == "gpu_1x_a10"),
                                "ci-key")
    runner = CliRunner()
    listed = json.loads(runner.invoke(fleet, ["list", "--json"]).stdout)
    ledger_rows = [e for e in listed if e.get("source") != "cloud"]
    cloud_rows = {e["instance"]: e for e in listed if e.get("source") == "cloud"}
    assert [(e["run_id"], e["state"], e["driver_alive"]) for e in ledger_rows] == [("killed", "healthy", False)]
    assert cloud_rows["teibatch-killed-7"]["in_ledger"] == "missing"
    assert cloud_rows["teibatch-killed-7"]["cloud_id"] == orphan
    swept = runner.invoke(fleet, ["sweep"])
    assert swept.exit_code == 0, swept.output
    assert "killed: destroyed (2 instance(s))" in swept.output
    settled(fake_lambda, host)
    assert (tmp_path / "exports" / "teibatch-killed-0" / "_export.json").exists()
    assert runner.invoke(fleet, ["sweep"]).output.strip() == "nothing to sweep"
    assert runner.invoke(fleet, ["list"]).output.strip() == "nothing left running"
