"""Provider vast against a fake Vast.ai whose instances are real ``teibatch serve --api-key`` processes.

Every case ends with no instance alive in the fake and no instance process running; the full job also
proves that neither the Vast API key nor the run's TEI key appears in anything written.
"""

from __future__ import annotations

import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import orjson
import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli_fleet import fleet
from teibatch.errors import CapacityUnavailable, CloudApiError, ExportFailed, FleetError, JobSpecError
from teibatch.fleet import ExportPlan, LaunchSpec, Ledger, running, session
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.export import export_volume
from teibatch.fleet.offers import GpuWant, Offer
from teibatch.fleet.providers.vast import SEARCH_TYPES, SEED_WAIT, VastApi, VastProvider, bid_for, docker_env
from teibatch.fleet.shell import LocalShell, SshLogin
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.plan import estimate_run
from teibatch.pipeline.pricing import card_estimate
from teibatch.pipeline.run_fleet import job_provider
from tests.fleet.conftest import VAST_KEY, SshHostFixture, kill_when_ready, sweep_destroys_what_the_killed_run_left
from tests.fleet.fake_vast import SSH_RUNTYPE, FakeVast
from tests.fleet.standin_docker import hub_files
from tests.fleet.test_lambda import _env
from tests.fleet.test_run_ssh import corpus, files_under

MODEL = "BAAI/bge-small-en-v1.5"
GPUS = ("RTX 4090", "RTX A6000")


def write_job(tmp_path: Path, servers: dict[str, Any] | None = None, **sections: Any) -> Path:
    spec = {"name": "vast-job", "corpus": {"path": str(corpus(tmp_path)), "id_field": "id", "shard_docs": 10},
            "model": {"id": MODEL},
            "servers": {"provider": "vast", "count": 2, "gpu": list(GPUS), "startup_timeout": 30,
                        **(servers or {})},
            "export": {"waive": True}, "output": {"path": str(tmp_path / "out")}, **sections}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def provider(ledger: Ledger, *, capacity: str = "on-demand", max_price: float | None = None,
             **options: Any) -> VastProvider:
    want = GpuWant(names=options.pop("gpu", GPUS), max_price=max_price)
    api = VastApi(timeout=options.pop("api_timeout", 5.0), want=want, capacity=capacity)  # type: ignore[arg-type]
    settings = {"count": 1, "startup_timeout": 20.0, **options}
    return VastProvider(api, want=want, model_id=MODEL, ledger=ledger, **settings)


def exporting(fake: FakeVast, host: SshHostFixture, tmp_path: Path) -> dict[str, Any]:
    """The job's ``servers`` keys of a Vast run that exports: the test sshd stands in for every instance's."""
    fake.ssh_port = host.port
    return {"key_file": str(host.key_file), "ssh_user": host.user, "volume": str(tmp_path / "vast-data")}


def model_export(tmp_path: Path) -> Path:
    """An earlier run's export of the model directory, for ``export.import_from``: the hub files TEI would
    download, plus one file only the export has (a model directory holding it was seeded)."""
    earlier = tmp_path / "earlier-model"
    hub_files(str(earlier), MODEL)
    (earlier / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "main" / "tokenizer.json").write_text("{}")
    url = tmp_path / "earlier-exports" / "teibatch-earlier-0"
    export_volume(LocalShell(), str(earlier), str(url), timeout=60)
    return url


def exported_files(export: Path) -> dict[str, Any]:
    manifest = orjson.loads((export / "_export.json").read_bytes())
    return {rel: info["sha256"] for rel, info in manifest["files"].items()}


@pytest.mark.timeout(120)
@pytest.mark.usefixtures("ray_session")
def test_full_job_rents_instances_embeds_and_destroys(fake_vast: FakeVast, tmp_path: Path, ledger: Ledger,
                                                      caplog: pytest.LogCaptureFixture,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level("DEBUG")
    summary = run_job(load_job(write_job(tmp_path)))
    assert summary.embedded == 40 and summary.status == "done"
    assert fake_vast.alive() == 0
    assert len(fake_vast.creates) == 2 and len(fake_vast.destroys) == 2
    [search] = fake_vast.searches
    assert search["type"] == "ondemand" and search["num_gpus"] == {"eq": 1}
    assert search["gpu_name"] == {"in": list(GPUS)} and search["reliability2"] == {"gte": 0.98}
    create = fake_vast.creates[0]
    assert create["offer_id"] == 1001  # the cheapest per unit of throughput of the reliable RTX 4090s and A6000s
    assert {c["offer_id"] for c in fake_vast.creates} == {1001, 1002}
    assert create["image"] == "ghcr.io/huggingface/text-embeddings-inference:89-1.9"  # compute_cap 890
    assert create["runtype"] == "args" and create["onstart"] == "timeout" and "price" not in create
    assert create["args"][3:6] == ["/entrypoint.sh", "--model-id", MODEL]
    # each create call names its instance uniquely: the second server's first offer (1001) was taken by the
    # first server, so the instance it got comes from its second create call, "<name>.1"
    assert {c["label"] for c in fake_vast.creates} == {f"teibatch-{summary.run_id}-0", f"teibatch-{summary.run_id}-1.1"}
    tei_key = create["env"]["API_KEY"]
    assert len(tei_key) >= 32
    record = ledger.load(summary.run_id)
    assert record is not None and record["config"] == {"kind": "vast", "model_id": MODEL, "capacity": "on-demand"}
    assert {e.state.value for e in ledger.entries()} == {"destroyed"}
    assert {entry["cloud_id"] for entry in record["instances"].values()} == {str(i) for i in fake_vast.destroys}
    searched = files_under(tmp_path / "out", tmp_path / "state")
    assert len(searched) > 5
    for path in searched:
        data = path.read_bytes()
        assert VAST_KEY.encode() not in data and tei_key.encode() not in data, f"a secret is in {path}"
    captured = capsys.readouterr()
    for text in (caplog.text, captured.out, captured.err, repr(job_provider(load_job(tmp_path / "job.yaml")))):
        assert VAST_KEY not in text and tei_key not in text


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("ray_session")
def test_full_job_with_export_copies_the_model_off_over_ssh_then_destroys(
        fake_vast: FakeVast, host: SshHostFixture, tmp_path: Path, ledger: Ledger) -> None:
    servers = exporting(fake_vast, host, tmp_path)
    summary = run_job(load_job(write_job(tmp_path, servers, export={"to": str(tmp_path / "exports")})))
    assert summary.embedded == 40 and summary.status == "done"
    assert fake_vast.alive() == 0
    assert len(fake_vast.creates) == 2 and len(fake_vast.destroys) == 2
    for create in fake_vast.creates:
        assert create["runtype"] == SSH_RUNTYPE and "args" not in create
        assert create["onstart"].startswith("nohup timeout -k 30s ")
        assert f"/entrypoint.sh --huggingface-hub-cache {tmp_path / 'vast-data'} --model-id {MODEL}" \
            in create["onstart"]
    public_key = host.key_file.with_name(host.key_file.name + ".pub").read_text().strip()
    assert fake_vast.ssh_keys == {i: public_key for i in fake_vast.destroys}
    record = ledger.load(summary.run_id)
    assert record is not None and record["export_to"] == str(tmp_path / "exports")
    names = sorted(record["instances"])
    assert names == [f"teibatch-{summary.run_id}-{i}" for i in range(2)]
    model_dir = tmp_path / "vast-data"
    [blob] = (model_dir / "models--BAAI--bge-small-en-v1.5" / "blobs").iterdir()
    for name in names:
        entry = record["instances"][name]
        assert entry["state"] == "destroyed" and entry["export"]["verified"] is True
        assert entry["shell"]["port"] == host.port and entry["volume"] == str(model_dir)
        export = tmp_path / "exports" / name
        assert set(exported_files(export)) == {str(blob.relative_to(model_dir)),
                                               "models--BAAI--bge-small-en-v1.5/snapshots/main/config.json"}
        assert (export / "data" / blob.relative_to(model_dir)).read_bytes() == blob.read_bytes()
    steps = [step["state"] for step in record["instances"][names[0]]["steps"]]
    assert steps.index("healthy") < steps.index("destroyed")  # destroyed only once the export verified
    tei_key = fake_vast.creates[0]["env"]["API_KEY"]
    for path in files_under(tmp_path / "out", tmp_path / "state", tmp_path / "exports"):
        data = path.read_bytes()
        assert VAST_KEY.encode() not in data and tei_key.encode() not in data, f"a secret is in {path}"


@pytest.mark.timeout(150)
@pytest.mark.usefixtures("ray_session")
def test_full_job_with_import_seeds_every_instance_before_its_tei_starts(
        fake_vast: FakeVast, host: SshHostFixture, tmp_path: Path, ledger: Ledger) -> None:
    servers = exporting(fake_vast, host, tmp_path)
    earlier = model_export(tmp_path)
    export = {"to": str(tmp_path / "exports"), "import_from": str(earlier.parent)}  # the folder above: its first
    summary = run_job(load_job(write_job(tmp_path, servers, export=export)))
    assert summary.embedded == 40 and summary.status == "done"
    assert fake_vast.alive() == 0 and len(fake_vast.creates) == 2
    model_dir = tmp_path / "vast-data"
    for create in fake_vast.creates:
        words = shlex.split(create["onstart"])
        marker = f"{model_dir}/.teibatch-seeded-{create['label']}"
        assert words[:7] == ["nohup", "sh", "-c", SEED_WAIT, "seed-wait", marker, "30"]  # startup_timeout
        assert words[7:10] == ["timeout", "-k", "30s"]
    # each router started on its marker (not after the 30 s bound) and found the model: it downloaded nothing
    assert len(fake_vast.starts) == 2
    for start in fake_vast.starts.values():
        assert start["downloaded"] is False and start["waited_s"] < 29
    record = ledger.load(summary.run_id)
    assert record is not None
    for name, entry in record["instances"].items():
        assert entry["imported"] == str(earlier.parent) and "import_error" not in entry
        # what is exported at the end is what was seeded (the file only the import had included), no marker
        assert exported_files(tmp_path / "exports" / name) == exported_files(earlier)
    assert not list(model_dir.glob(".teibatch-seeded-*"))


@pytest.mark.timeout(120)
def test_an_import_that_fails_is_logged_and_tei_downloads_the_model(fake_vast: FakeVast, host: SshHostFixture,
                                                                   tmp_path: Path, ledger: Ledger,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    servers = exporting(fake_vast, host, tmp_path)
    earlier = model_export(tmp_path)
    [blob] = (earlier / "data" / "models--BAAI--bge-small-en-v1.5" / "blobs").iterdir()
    blob.unlink()  # the export lost its weights
    fleet_ = provider(ledger, login=SshLogin(user=servers["ssh_user"], key_file=servers["key_file"]),
                      model_dir=servers["volume"])
    with session(fleet_, LaunchSpec(run_id="fallback", import_from=str(earlier)), ExportPlan(waive=True)) as served:
        assert len(served) == 1
        [start] = fake_vast.starts.values()
        assert start["downloaded"] is True and start["waited_s"] < 19  # started on the marker all the same
    assert fake_vast.alive() == 0
    entry = (ledger.load("fallback") or {})["instances"]["teibatch-fallback-0"]
    assert "imported" not in entry and entry["state"] == "destroyed"
    assert "could not import" in entry["import_error"] and blob.name in entry["import_error"]
    assert "import from" in caplog.text and "TEI will download the model" in caplog.text


def test_the_seed_wait_ends_on_the_marker_or_after_its_bound(tmp_path: Path) -> None:
    marker = tmp_path / ".teibatch-seeded-x"

    def start(wait_s: int) -> tuple[bytes, float]:
        began = time.monotonic()
        done = subprocess.run(["sh", "-c", SEED_WAIT, "seed-wait", str(marker), str(wait_s), "echo", "started"],
                              capture_output=True, timeout=30, check=True)
        return done.stdout, time.monotonic() - began

    output, took = start(2)
    assert output == b"started\n" and 2 <= took < 10  # no seed came: TEI starts (and downloads) all the same
    marker.touch()
    output, took = start(20)
    assert output == b"started\n" and took < 5 and not marker.exists()  # the seed is done: at once, marker gone


@pytest.mark.timeout(120)
def test_export_that_fails_keeps_the_instance_until_sweep_waives_it(fake_vast: FakeVast, host: SshHostFixture,
                                                                   tmp_path: Path, ledger: Ledger) -> None:
    servers = exporting(fake_vast, host, tmp_path)
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the export folder should be")
    fleet_ = provider(ledger, login=SshLogin(user=servers["ssh_user"], key_file=servers["key_file"]),
                      model_dir=servers["volume"])
    with pytest.raises(ExportFailed, match="kept, nothing holding data destroyed") as caught, \
            session(fleet_, LaunchSpec(run_id="kept", export_to=str(blocker)), ExportPlan(to=str(blocker))):
        pass
    assert "teibatch-kept-0" in str(caught.value) and "fleet sweep --waive-export" in str(caught.value)
    assert fake_vast.destroys == [] and fake_vast.alive() == 2  # the instance (and its TEI) is kept
    entry = (ledger.load("kept") or {})["instances"]["teibatch-kept-0"]
    assert (entry["state"], entry["kept"], entry["export"]["verified"]) == ("healthy", "export not verified", False)
    runner = CliRunner()
    again = runner.invoke(fleet, ["sweep"])  # the export still fails: still kept
    assert "kept: kept" in again.output and fake_vast.alive() == 2
    swept = runner.invoke(fleet, ["sweep", "--waive-export"])
    assert swept.exit_code == 0, swept.output
    assert "kept: destroyed" in swept.output
    assert fake_vast.alive() == 0 and [e["state"] for e in (ledger.load("kept") or {})["instances"].values()] == [
        "destroyed"]
    assert runner.invoke(fleet, ["list"]).output.strip() == "nothing left running"


@pytest.mark.timeout(150)
def test_sigkill_of_an_exporting_run_then_fleet_sweep_exports_and_destroys(
        fake_vast: FakeVast, host: SshHostFixture, tmp_path: Path, ledger: Ledger) -> None:
    servers = exporting(fake_vast, host, tmp_path)
    script = (
        "import sys, time\n"
        "from teibatch.fleet import session, LaunchSpec, ExportPlan\n"
        "from teibatch.fleet.shell import SshLogin\n"
        "from teibatch.fleet.providers.vast import VastApi, VastProvider\n"
        "from teibatch.fleet.offers import GpuWant\n"
        "user, key_file, model_dir, to = sys.argv[1:5]\n"
        "want = GpuWant(names=('RTX 4090',))\n"
        "fleet = VastProvider(VastApi(want=want), count=1, want=want, model_id='BAAI/bge-small-en-v1.5',"
        " startup_timeout=30, login=SshLogin(user=user, key_file=key_file), model_dir=model_dir)\n"
        "with session(fleet, LaunchSpec(run_id='killed', export_to=to), ExportPlan(to=to)):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n")
    to = tmp_path / "exports"
    kill_when_ready([sys.executable, "-c", script, servers["ssh_user"], servers["key_file"], servers["volume"],
                     str(to)], _env(tmp_path))
    assert fake_vast.alive() == 2 and not to.exists()  # the driver is gone; its instance, never exported, is not
    swept = CliRunner().invoke(fleet, ["sweep"])
    assert swept.exit_code == 0, swept.output
    assert "killed: destroyed" in swept.output
    assert fake_vast.alive() == 0
    assert exported_files(to / "teibatch-killed-0")  # copied off, and verified, before the instance went
    entry = (ledger.load("killed") or {})["instances"]["teibatch-killed-0"]
    assert entry["state"] == "destroyed" and entry["export"]["verified"] is True


@pytest.mark.timeout(60)
def test_offer_already_taken_moves_on_and_the_port_needs_the_run_key(fake_vast: FakeVast, ledger: Ledger) -> None:
    fake_vast.taken.add(1001)
    with running(provider(ledger), LaunchSpec(run_id="taken")) as endpoints:
        [endpoint] = endpoints
        assert httpx.post(f"{endpoint.url}/embed", json={"inputs": "x"}, timeout=10).status_code == 401
        answer = httpx.post(f"{endpoint.url}/embed", json={"inputs": "x"}, timeout=10,
                            headers={"Authorization": f"Bearer {endpoint.api_key}"})
        assert answer.status_code == 200
    assert fake_vast.create_attempts == [1001, 1002]
    assert fake_vast.alive() == 0


@pytest.mark.timeout(60)
def test_instance_stuck_loading_is_destroyed_and_replaced(fake_vast: FakeVast, ledger: Ledger) -> None:
    fake_vast.stuck = 1
    with running(provider(ledger, startup_timeout=4.0), LaunchSpec(run_id="stuck")) as endpoints:
        assert len(endpoints) == 1
        assert len(fake_vast.creates) == 2 and len(fake_vast.destroys) == 1
    assert fake_vast.alive() == 0
    record = ledger.load("stuck")
    assert record is not None and "status loading" in record["instances"]["teibatch-stuck-0"]["error"]


@pytest.mark.timeout(60)
def test_replacements_are_bounded(fake_vast: FakeVast, ledger: Ledger) -> None:
    fake_vast.stuck = 5
    with pytest.raises(CapacityUnavailable, match=r"never became healthy \(servers.max_replacements: 1\)"), \
            running(provider(ledger, startup_timeout=2.0, max_replacements=1), LaunchSpec(run_id="bounded")):
        pass
    assert len(fake_vast.creates) == 2 and fake_vast.alive() == 0


@pytest.mark.timeout(60)
def test_gone_and_5xx_answers(fake_vast: FakeVast, ledger: Ledger) -> None:
    fake_vast.fail_after_create = 1   # made, then 503: found by its label and adopted
    fake_vast.show_errors = 2         # polls that get a 502 are tried again
    fake_vast.destroy_errors = 1      # a destroy that gets a 503 is sent again
    fleet_ = provider(ledger)
    with running(fleet_, LaunchSpec(run_id="flaky")) as endpoints:
        assert len(endpoints) == 1
    assert len(fake_vast.creates) == 1 and fake_vast.alive() == 0
    [instance] = fleet_.instances()
    assert instance.state.value == "destroyed"
    api = VastApi()
    assert api.get(str(fake_vast.destroys[0])) is None  # no longer listed
    api.terminate(str(fake_vast.destroys[0]))           # and destroying it again (404) is done already
    api.close()


@pytest.mark.timeout(60)
def test_interruptible_bid_is_capped_by_max_price(fake_vast: FakeVast, ledger: Ledger) -> None:
    fake_vast.taken.add(1001)  # min bid 0.25: the next is 1002, min bid 0.29, bid 0.319 capped at 0.30
    with running(provider(ledger, capacity="spot", max_price=0.30, gpu=("RTX 4090",)), LaunchSpec(run_id="bid")):
        pass
    [search] = fake_vast.searches
    assert search["type"] == "bid" and search["min_bid"] == {"lte": 0.30} and "dph_total" not in search
    [create] = fake_vast.creates
    assert (create["offer_id"], create["price"]) == (1002, 0.30)
    assert fake_vast.create_attempts == [1001, 1002] and fake_vast.alive() == 0
    record = ledger.load("bid")
    assert record is not None
    assert record["instances"]["teibatch-bid-0"]["offer"] == "1002 (interruptible)"
    assert record["instances"]["teibatch-bid-0"]["price_per_hour"] == 0.30


@pytest.mark.parametrize(("min_bid", "max_price", "bid"), [
    pytest.param(0.25, None, 0.275, id="margin"),
    pytest.param(0.25, 0.26, 0.26, id="capped"),
    pytest.param(0.35, 0.30, 0.35, id="over-the-cap-is-refused-later"),
])
def test_bid_for(min_bid: float, max_price: float | None, bid: float) -> None:
    assert bid_for(min_bid, max_price) == pytest.approx(bid)


@pytest.mark.timeout(60)
def test_any_rents_a_bid_first_and_falls_back_to_on_demand(fake_vast: FakeVast, ledger: Ledger) -> None:
    def rent(run_id: str) -> dict[str, Any]:
        with running(provider(ledger, capacity="any", max_price=0.45, gpu=("RTX 4090",)), LaunchSpec(run_id=run_id)):
            pass
        assert fake_vast.alive() == 0
        return fake_vast.creates[-1]

    first = rent("any")
    assert (first["offer_id"], first["price"]) == (1001, 0.275)  # a bid fits: interruptible first
    assert [s["type"] for s in fake_vast.searches] == ["bid", "ondemand"]
    fake_vast.offers = [dict(o, min_bid=0.9) for o in fake_vast.offers]  # no bid fits under max_price any more
    second = rent("any2")
    assert second["offer_id"] == 1002 and "price" not in second  # on-demand (machine 1001 is rented already)


@pytest.mark.timeout(60)
def test_plan_prices_come_from_the_offers(fake_vast: FakeVast, tmp_path: Path) -> None:
    estimate = estimate_run(load_job(write_job(tmp_path, {"capacity": "any"})))
    assert estimate.provider == "vast" and estimate.billing is not None and estimate.billing.increment_s == 1
    cards = {(c.offer.gpu, c.offer.interruptible): c.offer.price_per_hour for c in estimate.cards}
    assert cards == {("RTX 4090", True): 0.275, ("RTX 4090", False): 0.40, ("RTX A6000", True): 0.385,
                     ("RTX A6000", False): 0.47}


def offers_with_the_key_found() -> int:
    api = VastApi(timeout=5.0)
    try:
        return len(api.offers())
    finally:
        api.close()


def test_credentials_from_the_env_var_then_the_key_files(fake_vast: FakeVast, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("VAST_API_KEY")
    with pytest.raises(JobSpecError, match=r"set VAST_API_KEY, or put the key in .*vast_api_key"):
        VastApi()
    home.mkdir()
    (home / ".vast_api_key").write_text(VAST_KEY + "\n")  # the CLI's older file
    assert offers_with_the_key_found() > 0
    (home / ".config" / "vastai").mkdir(parents=True)
    (home / ".config" / "vastai" / "vast_api_key").write_text(VAST_KEY)
    (home / ".vast_api_key").write_text("a-wrong-key")  # the newer file comes first
    assert offers_with_the_key_found() > 0
    monkeypatch.setenv("VAST_API_KEY", "another-wrong-key")  # the variable comes before any file
    with pytest.raises(CloudApiError, match="refused the API key") as refused:
        offers_with_the_key_found()
    assert refused.value.status_code == 401 and "another-wrong-key" not in str(refused.value)


def test_job_rules(fake_vast: FakeVast, tmp_path: Path, client_key: Path) -> None:
    to = {"to": str(tmp_path / "volumes")}
    with pytest.raises(JobSpecError, match=r"set export\.to \(and servers\.key_file\).*or export\.waive: true"):
        job_provider(load_job(write_job(tmp_path, export={})))
    with pytest.raises(JobSpecError, match=r"set servers\.key_file") as caught:
        job_provider(load_job(write_job(tmp_path, export=to)))
    assert caught.value.key == "servers.key_file"
    with pytest.raises(JobSpecError, match=r"servers\.key_file: cannot read .*nokey\.pub") as caught:
        job_provider(load_job(write_job(tmp_path, {"key_file": str(tmp_path / "nokey")}, export=to)))
    assert caught.value.key == "servers.key_file"
    with pytest.raises(JobSpecError, match=r"servers\.volume: 'data'.*absolute path"):
        job_provider(load_job(write_job(tmp_path, {"key_file": str(client_key), "volume": "data"}, export=to)))
    with pytest.raises(JobSpecError, match=r"servers\.ssh_port is not used by provider vast"):
        load_job(write_job(tmp_path, {"ssh_port": 2222}))
    exporting_ = job_provider(load_job(write_job(tmp_path, {"key_file": str(client_key)}, export=to)))
    assert isinstance(exporting_, VastProvider) and exporting_.login is not None
    assert (exporting_.login.user, exporting_.model_dir) == ("root", "/data")
    importing = {"waive": True, "import_from": str(tmp_path / "earlier")}
    with pytest.raises(JobSpecError, match=r"export\.import_from on provider vast .* set servers\.key_file.*"
                                           r"or remove export\.import_from") as caught:
        job_provider(load_job(write_job(tmp_path, export=importing)))
    assert caught.value.key == "servers.key_file"
    seeding = job_provider(load_job(write_job(tmp_path, {"key_file": str(client_key)}, export=importing)))
    assert isinstance(seeding, VastProvider) and seeding.login is not None
    with pytest.raises(FleetError, match="needs a login"):
        provider(Ledger(tmp_path / "ledger")).up(LaunchSpec(run_id="no-login", import_from=str(tmp_path)))
    with pytest.raises(JobSpecError, match=r"servers\.capacity is for the GPU clouds"):
        load_job(write_job(tmp_path, {"provider": "local", "capacity": "spot", "gpu": []}))
    with pytest.raises(JobSpecError, match=r"servers\.regions is not supported by provider vast"):
        load_job(write_job(tmp_path, {"regions": ["US"]}))
    assert isinstance(job_provider(load_job(write_job(tmp_path, {"capacity": "spot"}))), VastProvider)


@pytest.mark.timeout(120)
def test_sigkill_then_fleet_sweep_destroys_the_instances(fake_vast: FakeVast, tmp_path: Path,
                                                         ledger: Ledger) -> None:
    script = (
        "import time\n"
        "from teibatch.fleet import running, LaunchSpec\n"
        "from teibatch.fleet.providers.vast import VastApi, VastProvider\n"
        "from teibatch.fleet.offers import GpuWant\n"
        "want = GpuWant(names=('RTX 4090',))\n"
        "fleet = VastProvider(VastApi(want=want), count=1, want=want, model_id='BAAI/bge-small-en-v1.5',"
        " startup_timeout=30)\n"
        "with running(fleet, LaunchSpec(run_id='killed')):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n")
    kill_when_ready([sys.executable, "-c", script], _env(tmp_path))
    assert fake_vast.alive() == 2  # the instance and its process outlive the driver
    sweep_destroys_what_the_killed_run_left(fake_vast.alive, "teibatch-killed-0")


@pytest.mark.parametrize(("interruptible", "price", "cost"), [
    pytest.param(False, 0.40, 0.49, id="on-demand"),
    pytest.param(True, 0.275, 0.34, id="spot"),
])
def test_the_worked_cost_example_of_the_docs(interruptible: bool, price: float, cost: float) -> None:
    offer = Offer(cloud="vast", key="1001", gpu="RTX 4090", vram_gb=24, price_per_hour=price,
                  interruptible=interruptible, compute_capability="8.9")
    card = card_estimate(offer, tokens=500_000_000, count=4, startup_s=900, billing=billing_rules()["vast"],
                         parameters=33_400_000, bench_tokens_per_s=None)
    assert card.tokens_per_s == pytest.approx(617_515, abs=1) and card.billed_seconds == 1103
    assert card.gpu_hours == pytest.approx(1.23, abs=0.005) and card.cost == pytest.approx(cost, abs=0.005)


def _row(instance_id: int, label: str) -> dict[str, Any]:
    return {"id": instance_id, "label": label, "actual_status": "running", "intended_status": "running",
            "cur_state": "running", "public_ipaddr": "127.0.0.1", "ports": {}, "dph_total": 0.4}


def test_the_instance_list_is_v1_and_followed_page_by_page(fake_vast: FakeVast) -> None:
    fake_vast.page_size = 2
    with fake_vast.lock:
        for n in range(5):
            fake_vast.instances[8_000_000 + n] = _row(8_000_000 + n, f"teibatch-paged-{n}")
        fake_vast.instances[8_000_010] = _row(8_000_010, "someone-else")
    api = VastApi()
    assert sorted(i.name for i in api.list("teibatch-paged-")) == [f"teibatch-paged-{n}" for n in range(5)]
    api.close()
    lists = [(method, path) for method, path, _ in fake_vast.requests if "instances" in path]
    assert lists == [("GET", "/api/v1/instances")] * 3  # 6 instances, 2 a page; never the deprecated v0 list


@pytest.mark.timeout(60)
def test_a_bid_under_a_risen_min_bid_tries_the_next_offer(fake_vast: FakeVast, ledger: Ledger) -> None:
    fake_vast.min_bid_now[1001] = 0.40  # it was 0.25 when searched: the bid (0.275) is now too low
    with running(provider(ledger, capacity="spot", gpu=("RTX 4090",)), LaunchSpec(run_id="risen")) as endpoints:
        assert len(endpoints) == 1
    assert fake_vast.create_attempts == [1001, 1002]  # the run goes on with the next offer
    assert [c["offer_id"] for c in fake_vast.creates] == [1002] and fake_vast.alive() == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("status", [pytest.param("exited", id="exited"), pytest.param("unknown", id="unknown"),
                                    pytest.param("offline", id="offline")])
def test_an_instance_that_never_runs_is_given_back_at_once(fake_vast: FakeVast, ledger: Ledger, status: str) -> None:
    fake_vast.end_as = [status]
    with running(provider(ledger, startup_timeout=20.0), LaunchSpec(run_id="ends")) as endpoints:
        assert len(endpoints) == 1
    first = fake_vast.creates[0]["offer_id"]
    assert len(fake_vast.creates) == 2 and fake_vast.alive() == 0
    dead = min(fake_vast.instances)  # the first instance made
    polls = [path for method, path, _ in fake_vast.requests if method == "GET" and path.endswith(f"/{dead}/")]
    assert first == 1001 and len(polls) <= 3, polls  # seen once as it is, not polled until startup_timeout
    record = ledger.load("ends")
    assert record is not None and f"status {status}" in record["instances"]["teibatch-ends-0"]["error"]


def _put(fake: FakeVast, path: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.request("PUT" if "asks" in path else "POST", f"{fake.api_url}{path}", json=body, timeout=10,
                         headers={"Authorization": f"Bearer {VAST_KEY}"})


@pytest.mark.parametrize(("path", "body", "named"), [
    pytest.param("/bundles/", {"type": "on-demand", "limit": 5}, "$.type: 'on-demand' is not one of",
                 id="search-type-on-demand"),
    pytest.param("/asks/1001/", {"image": "img", "env": {"API_KEY": "k"}}, "$.env: {'API_KEY': 'k'} is not of type",
                 id="env-as-an-object"),
    pytest.param("/asks/1001/", {"image": "img", "runtype": "ssh_direc ssh_proxy"}, "$.runtype: 'ssh_direc ssh_proxy'",
                 id="runtype-not-in-the-enum"),
    pytest.param("/asks/1001/", {"label": "x"}, "$: 'image' is a required property", id="missing-image"),
    pytest.param("/asks/x/", {"image": "img"}, "path parameter id: 'x' is not of type 'integer'", id="offer-id"),
])
def test_spec_check_bites(fake_vast: FakeVast, path: str, body: dict[str, Any], named: str) -> None:
    answer = _put(fake_vast, path, body)
    assert answer.status_code == 400, answer.text
    refused = answer.json()
    assert refused["success"] is False and refused["error"] == "invalid_args" and named in refused["msg"], refused
    assert fake_vast.creates == [] and fake_vast.searches == []
    v0 = httpx.get(f"{fake_vast.api_url}/instances/", headers={"Authorization": f"Bearer {VAST_KEY}"}, timeout=10)
    assert v0.status_code == 404  # the deprecated v0 list is not in the spec


def test_the_providers_requests_keep_to_the_spec(fake_vast: FakeVast, ledger: Ledger) -> None:
    spec = fake_vast.spec
    assert spec is not None
    search = spec.find("POST", "/api/v0/bundles/")
    create = spec.find("PUT", "/api/v0/asks/1001/")
    assert search is not None and create is not None
    api = VastApi(want=GpuWant(names=GPUS, min_vram_gb=20, max_price=0.5), capacity="any")
    for kind in SEARCH_TYPES["any"]:
        assert spec.request_problems(*search, {}, api.search_query(kind)) == [], kind
    offer = next(o for o in api.offers() if o.key == "1001")
    body = provider(ledger).instance_request("teibatch-spec-0", offer, 600)
    assert spec.request_problems(*create, {}, {**body, "env": docker_env(body["env"])}) == []
    assert docker_env({"API_KEY": "a b", "-p 80:80": "1"}) == "-e API_KEY='a b' -p 80:80"
    assert fake_vast.refused == []
    api.close()


def test_rate_limit_answers_429_with_retry_after_within_the_spec(fake_vast: FakeVast) -> None:
    fake_vast.rate_limit, fake_vast.rate_window_s = 1, 30.0
    auth = {"Authorization": f"Bearer {VAST_KEY}"}
    url = f"{fake_vast.url}/api/v1/instances?limit=25"
    answers = [httpx.get(url, headers=auth, timeout=10) for _ in range(2)]
    assert [a.status_code for a in answers] == [200, 429]
    assert 1 <= int(answers[1].headers["Retry-After"]) <= 30 and answers[1].json()["error"] == "rate_limit_exceeded"
    assert fake_vast.throttled == 1 and fake_vast.answer_problems == []
