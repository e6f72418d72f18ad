"""Whole jobs on provider ssh: a full run, a crash, SIGTERM and SIGINT on the driver, SIGKILL then sweep.

Every case ends with no stand-in container running; the full run also proves that neither the API key
nor the SSH private key appears in any output, report, manifest, ledger, export, recorded call or log.
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
from teibatch.errors import WrongModelKind
from teibatch.fleet import Ledger
from teibatch.job import load_job
from teibatch.pipeline import run_job
from tests.conftest import write_jsonl
from tests.fleet.conftest import SshHostFixture, kill_when_ready, signal_after_first_commit

REPO = Path(__file__).resolve().parents[2]
MODEL = "BAAI/bge-small-en-v1.5"
WAIT_S = 90.0


def corpus(tmp_path: Path, count: int = 40) -> Path:
    rows = [{"id": f"d{i:03d}", "text": f"document {i} about topic {i % 7}"} for i in range(count)]
    write_jsonl(tmp_path / "corpus" / "docs.jsonl", rows)
    return tmp_path / "corpus"


def write_job(tmp_path: Path, host: SshHostFixture, *, server_args: list[str] | None = None,
              **sections: Any) -> Path:
    spec = {
        "name": "ssh-job",
        "corpus": {"path": str(corpus(tmp_path)), "id_field": "id", "shard_docs": 10},
        "model": {"id": MODEL},
        "servers": {"provider": "ssh", "startup_timeout": 30, "volume": str(tmp_path / "volume"),
                    "remove_volume": True, "server_args": server_args or [],
                    "hosts": [host.host(destroy_command=f"echo $TEIBATCH_INSTANCE >> {tmp_path}/destroyed")]},
        "export": {"to": str(tmp_path / "exports")},
        "output": {"path": str(tmp_path / "out")},
        **sections,
    }
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def all_destroyed(tmp_path: Path) -> bool:
    entries = Ledger(tmp_path / "state" / "ledger").entries()
    return bool(entries) and all(e.state.value == "destroyed" for e in entries)


def files_under(*roots: Path) -> list[Path]:
    return [p for root in roots if root.exists() for p in root.rglob("*") if p.is_file() and not p.is_symlink()]


@pytest.mark.usefixtures("ray_session")
def test_full_job_and_no_secret_anywhere(host: SshHostFixture, tmp_path: Path, ledger: Ledger,
                                         caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]) -> None:
    caplog.set_level("DEBUG")
    summary = run_job(load_job(write_job(tmp_path, host)))
    assert summary.embedded == 40 and summary.status == "done"
    assert host.standin.running() == 0
    assert all_destroyed(tmp_path)
    assert (tmp_path / "destroyed").read_text().split() == [f"teibatch-{summary.run_id}-0"]
    manifest = json.loads((tmp_path / "exports" / f"teibatch-{summary.run_id}-0" / "_export.json").read_text())
    assert manifest["files"] and manifest["source"]["run_id"] == summary.run_id
    assert not (tmp_path / "volume").exists()  # remove_volume, after the verified export
    # The secrets: the run's API key (as the stand-in docker received it) and the private key.
    api_key = host.standin.api_key()
    assert api_key and len(api_key) >= 32
    private = host.key_file.read_text()
    needles = [api_key.encode(), private.encode()]
    needles += [line.encode() for line in private.splitlines() if len(line) > 20 and "PRIVATE KEY" not in line]
    searched = files_under(tmp_path / "out", tmp_path / "state", tmp_path / "exports", host.standin.root / "logs")
    searched += [host.standin.root / "calls.jsonl", host.workdir / "sshd.log"]
    assert len(searched) > 10
    for path in searched:
        data = path.read_bytes()
        for needle in needles:
            assert needle not in data, f"a secret is in {path}"
    captured = capsys.readouterr()
    for text in (caplog.text, captured.out, captured.err):
        assert api_key not in text and private not in text


@pytest.mark.usefixtures("ray_session")
def test_job_crash_still_tears_down(host: SshHostFixture, tmp_path: Path, ledger: Ledger) -> None:
    job = load_job(write_job(tmp_path, host, server_args=["--model-kind", "reranker"]))
    with pytest.raises(WrongModelKind):
        run_job(job)
    assert host.standin.running() == 0
    assert all_destroyed(tmp_path)


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "TEIBATCH_STATE_DIR": str(tmp_path / "state"), "RAY_AUTH_MODE": "disabled",
            "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(REPO)}


@pytest.mark.parametrize("signum", [pytest.param(signal.SIGTERM, id="SIGTERM"),
                                    pytest.param(signal.SIGINT, id="SIGINT")])
def test_signal_on_the_driver_tears_down(host: SshHostFixture, tmp_path: Path, signum: int) -> None:
    job = write_job(tmp_path, host, server_args=["--simulate-gpu", "60", "--batch-overhead-s", "0.3"],
                    limits={"max_shards_in_flight": 1})

    def one_container_up() -> None:
        assert host.standin.running() == 1

    code, stderr = signal_after_first_commit(job, tmp_path, _env(tmp_path), signum, one_container_up, WAIT_S)
    assert code == 1, stderr.decode()[-2000:]
    assert b"interrupted" in stderr
    assert host.standin.running() == 0
    assert all_destroyed(tmp_path)
    api_key = host.standin.api_key()
    assert api_key and api_key.encode() not in stderr


def test_sigkill_then_fleet_sweep(host: SshHostFixture, tmp_path: Path, ledger: Ledger) -> None:
    script = (
        "import sys, json, time\n"
        "from teibatch.fleet import SshProvider, SshHost, session, LaunchSpec, ExportPlan\n"
        "host, to, volume = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]\n"
        "fleet = SshProvider([SshHost(**host)], model_id='BAAI/bge-small-en-v1.5', volume=volume,"
        " startup_timeout=30, remove_volume=True)\n"
        "with session(fleet, LaunchSpec(run_id='killed', export_to=to), ExportPlan(to=to)):\n"
        "    print('ready', flush=True)\n"
        "    time.sleep(120)\n")
    marker = tmp_path / "destroyed"
    spec = json.dumps(host.host(destroy_command=f"echo $TEIBATCH_INSTANCE >> {marker}"))
    kill_when_ready([sys.executable, "-c", script, spec, str(tmp_path / "exports"), str(tmp_path / "volume")],
                    _env(tmp_path))
    assert host.standin.running() == 1  # the driver is gone, its server is not
    runner = CliRunner()
    listed = runner.invoke(fleet, ["list", "--json"])
    assert listed.exit_code == 0, listed.output
    [entry] = json.loads(listed.stdout)
    assert (entry["run_id"], entry["state"], entry["driver_alive"]) == ("killed", "healthy", False)
    dry = runner.invoke(fleet, ["sweep", "--dry-run"])
    assert "would sweep" in dry.output and host.standin.running() == 1
    swept = runner.invoke(fleet, ["sweep"])
    assert swept.exit_code == 0, swept.output
    assert "killed: destroyed" in swept.output
    assert host.standin.running() == 0
    assert marker.read_text().split() == ["teibatch-killed-0"]
    assert (tmp_path / "exports" / "teibatch-killed-0" / "_export.json").exists()
    assert runner.invoke(fleet, ["sweep"]).output.strip() == "nothing to sweep"
    assert runner.invoke(fleet, ["list"]).output.strip() == "nothing left running"
