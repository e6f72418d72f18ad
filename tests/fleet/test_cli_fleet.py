"""``teibatch gpus`` and ``teibatch fleet list|sweep`` through click's runner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from teibatch.cli_fleet import fleet, gpus
from teibatch.fleet.base import InstanceState
from teibatch.fleet.ledger import Ledger


@pytest.mark.parametrize("args", [pytest.param([], id="gpus"), pytest.param(["list"], id="list"),
                                  pytest.param(["sweep"], id="sweep"), pytest.param(None, id="fleet")])
def test_help_has_examples(args: list[str] | None) -> None:
    command = gpus if args == [] else fleet
    result = CliRunner().invoke(command, [*(args or []), "--help"])
    assert result.exit_code == 0
    assert "Examples:" in result.output


def test_gpus_table_and_json() -> None:
    table = CliRunner().invoke(gpus, [])
    assert table.exit_code == 0
    assert "V100 16G" in table.output and "refused" in table.output and "experimental" in table.output
    assert "hopper-1.9" in table.output and "NOT SUPPORTED" in table.output
    data = json.loads(CliRunner().invoke(gpus, ["--json"]).stdout)
    assert len(data["gpus"]) == 29 and len(data["architectures"]) == 11
    volta = next(a for a in data["architectures"] if a["arch"] == "Volta")
    assert volta["status"] == "refused" and "7.5" in volta["reason"]


def test_list_and_sweep_with_an_empty_ledger(tmp_path: Path) -> None:
    runner = CliRunner()
    assert runner.invoke(fleet, ["list", "--state-dir", str(tmp_path)]).output.strip() == "nothing left running"
    assert runner.invoke(fleet, ["sweep", "--state-dir", str(tmp_path)]).output.strip() == "nothing to sweep"


def test_sweep_skips_a_run_whose_driver_still_runs(tmp_path: Path) -> None:
    ledger = Ledger(tmp_path / "ledger")
    ledger.begin("live", provider="ssh", job="j", config={"kind": "container"}, export_to=None)
    ledger.update("live", "teibatch-live-0", InstanceState.HEALTHY, host="h")
    result = CliRunner().invoke(fleet, ["sweep", "--state-dir", str(tmp_path)])
    assert result.exit_code == 0
    assert "live: skipped" in result.output and "still runs" in result.output
    listed = json.loads(CliRunner().invoke(fleet, ["list", "--json", "--state-dir", str(tmp_path)]).stdout)
    assert [(e["instance"], e["state"], e["driver_alive"]) for e in listed] == [("teibatch-live-0", "healthy", True)]
