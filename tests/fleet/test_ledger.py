"""The ledger: written before launches, atomic, listing, driver liveness."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from teibatch.fleet.base import InstanceState
from teibatch.fleet.ledger import Ledger, driver_alive, driver_record, state_dir


def test_records_steps_and_lists_entries(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path)
    ledger.begin("run-a", provider="ssh", job="j", config={"kind": "container"}, export_to=None)
    ledger.update("run-a", "teibatch-run-a-0", InstanceState.REQUESTED, host="u@h:22")
    ledger.update("run-a", "teibatch-run-a-0", InstanceState.HEALTHY, port=41000)
    ledger.update("run-a", "teibatch-run-a-0", None, export={"url": "s3://b/x", "verified": True})
    record = ledger.load("run-a")
    assert record is not None
    entry = record["instances"]["teibatch-run-a-0"]
    assert [s["state"] for s in entry["steps"]] == ["requested", "healthy"]
    assert entry["port"] == 41000 and entry["host"] == "u@h:22"
    [listed] = ledger.entries()
    assert (listed.run_id, listed.state, listed.export, listed.driver_alive) == \
        ("run-a", InstanceState.HEALTHY, "s3://b/x", True)
    ledger.release("run-a")
    assert not ledger.entries()[0].driver_alive
    assert [p.name for p in tmp_path.iterdir()] == ["run-a.json"]  # no temp file left behind


def test_unreadable_files_and_unknown_states_do_not_break_listing(tmp_path: Path) -> None:
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "odd.json").write_text('{"run_id": "odd", "instances": {"x": {"state": "exploded"}}}')
    [entry] = Ledger(tmp_path).entries()
    assert entry.state is InstanceState.UNKNOWN and not entry.state.settled


def test_driver_liveness() -> None:
    me = driver_record()
    assert driver_alive(me)
    assert not driver_alive({**me, "start": "0"})  # a pid reused by another process
    assert not driver_alive({**me, "hostname": "elsewhere"})


def test_state_dir_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TEIBATCH_STATE_DIR", str(tmp_path))
    assert state_dir() == tmp_path
    monkeypatch.delenv("TEIBATCH_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "teibatch"
    assert Ledger().directory == tmp_path / "xdg" / "teibatch" / "ledger"
    assert os.environ["XDG_STATE_HOME"]


def test_unwritable_ledger_stops_before_any_launch(tmp_path: Path) -> None:
    from teibatch.errors import FleetError
    from teibatch.fleet import ExportPlan, LaunchSpec, SshHost, SshProvider, session

    blocker = tmp_path / "a-file"
    blocker.write_text("in the way of the ledger directory")
    provider = SshProvider([SshHost(address="203.0.113.1")], ledger=Ledger(blocker / "ledger"))
    with pytest.raises(FleetError, match=r"cannot (read|write) the ledger"), \
            session(provider, LaunchSpec(run_id="r"), ExportPlan(waive=True)):
        pass
    assert all(not i.details for i in provider.instances())  # no host was contacted
