"""Instances taken back mid-run (fake RunPod: a pod stopped; fake Vast: a spot instance outbid): the run finishes.

The fakes stop an instance as the cloud does (RunPod: the pod ``EXITED``; Vast: the instance ``exited``,
``stopped``) and kill its container, the real ``teibatch serve`` process behind it. Each run has one
server, so every document after a preemption can only be embedded by a replacement: the run must find
the loss, rent a replacement, and send the rest there. Every document ends exactly once in the output,
nothing is left rented, and the ledger, the report and the HTML page show every instance. On Vast the
run imports an earlier export: every instance, the replacements too, starts TEI on the seeded model.
"""

from __future__ import annotations

import json
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jsonschema
import pyarrow.parquet as pq
import pytest
import yaml

from teibatch.fleet import Ledger
from teibatch.htmlreport import render_page
from teibatch.job import load_job
from teibatch.pipeline import run_job
from teibatch.pipeline.progress import SilentReporter
from tests.fleet.conftest import SshHostFixture
from tests.fleet.test_run_ssh import corpus
from tests.fleet.test_vast import exporting, model_export

REPO = Path(__file__).resolve().parents[2]
MODEL = "BAAI/bge-small-en-v1.5"
DOCUMENTS = 100
FRACTIONS = (0.3, 0.7)


class PreemptAt(SilentReporter):
    """Takes the serving instance back each time the documents embedded reach one of ``fractions`` of the run.

    It counts documents as they land, not shards as they commit: the driver writes the manifest for
    several finished shards at once (``Run.save_commits``), and on a busy machine the commits that
    cross 70% can come after the last shard's vectors are in, when a preemption finds nothing left
    to send. A shard's documents land while it runs, and the next shard starts only after it ends
    (one in flight), so each preemption comes with documents still to embed.
    """

    def __init__(self, preempt: Callable[[], Any], fractions: tuple[float, ...] = FRACTIONS) -> None:
        self.preempt = preempt
        self.due = list(fractions)
        self.total = 0
        self.done = 0
        self.taken: list[Any] = []

    def start(self, shards: int, documents: int) -> None:
        self.total = documents

    def advance(self, shards: int, documents: int, **fields: Any) -> None:
        self.done += documents
        while self.due and self.done >= self.due[0] * self.total:
            self.due.pop(0)
            self.taken.append(self.preempt())


def spot_job(tmp_path: Path, servers: dict[str, Any], **sections: Any) -> Path:
    spec = {"name": "spot-job",
            "corpus": {"path": str(corpus(tmp_path, DOCUMENTS)), "id_field": "id", "shard_docs": 10},
            "model": {"id": MODEL},
            # one shard at a time: the run is still going when each preemption comes
            "limits": {"max_shards_in_flight": 1},
            "servers": {"count": 1, "capacity": "spot", "startup_timeout": 30, "max_replacements": 2, **servers},
            "export": {"waive": True}, "output": {"path": str(tmp_path / "out")}, **sections}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def check_finished_run(out: Path, summary: Any, ledger: Ledger, alive: Callable[[], int], creates: int) -> None:
    """Every document exactly once, nothing left rented, and the ledger, report and page tell both losses."""
    assert (summary.status, summary.embedded) == ("done", DOCUMENTS), (
        f"reused {summary.reused}, rejected {dict(summary.rejected)}, committed {summary.shards_committed}, "
        f"errors {summary.errors}")
    ids = pq.read_table(out / "vectors", columns=["id"]).column("id").to_pylist()
    assert Counter(ids) == Counter(f"d{i:03d}" for i in range(DOCUMENTS))  # every document, exactly once
    assert alive() == 0 and creates == 3  # the first instance and two replacements, all given back

    record = ledger.load(summary.run_id)
    assert record is not None
    steps = {name: [s["state"] for s in entry["steps"]] for name, entry in record["instances"].items()}
    prefix = f"teibatch-{summary.run_id}-"
    assert set(steps) == {f"{prefix}{i}" for i in range(3)}
    for lost in (f"{prefix}0", f"{prefix}1"):
        assert steps[lost][-2:] == ["lost", "destroyed"], steps
    assert "lost" not in steps[f"{prefix}2"] and steps[f"{prefix}2"][-1] == "destroyed"

    report = json.loads((out / "runs" / f"{summary.run_id}.json").read_text())
    jsonschema.validate(report, json.loads((REPO / "docs" / "json" / "run-report.schema.json").read_text()))
    assert [(r["instance"], r["status"]) for r in report["replacements"]] == [(f"{prefix}0", "replaced"),
                                                                              (f"{prefix}1", "replaced")]
    events = Counter(e["event"] for e in report["events"])
    assert events["server_lost"] == 2 and events["server_replaced"] == 2 and events["instance_lost"] == 2
    costs = {i["name"]: i for i in report["cost"]["instances"]}
    assert set(costs) == set(steps) and [costs[n].get("lost", False) for n in sorted(costs)] == [True, True, False]
    page = render_page(report)
    assert "Servers taken back" in page and page.count("taken back by the cloud") >= 2


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("ray_session")
def test_runpod_pod_stopped_at_30_and_70_percent(fake_runpod: Any, tmp_path: Path, ledger: Ledger) -> None:
    # RunPod's API v2 rents on-demand pods only; a pod can still be stopped under the run (EXITED)
    job = spot_job(tmp_path, {"provider": "runpod", "gpu": ["RTX 4090"], "capacity": "on-demand"})

    def preempt() -> str:
        [pod] = fake_runpod.serving()
        fake_runpod.stop_pod(pod)
        return str(pod)

    reporter = PreemptAt(preempt)
    summary = run_job(load_job(job), reporter=reporter)
    assert len(reporter.taken) == 2
    check_finished_run(tmp_path / "out", summary, ledger, fake_runpod.alive, len(fake_runpod.creates))


@pytest.mark.timeout(180)
@pytest.mark.usefixtures("ray_session")
def test_vast_interruptible_instance_outbid_at_30_and_70_percent(fake_vast: Any, host: SshHostFixture,
                                                                 tmp_path: Path, ledger: Ledger) -> None:
    servers = exporting(fake_vast, host, tmp_path)
    earlier = model_export(tmp_path)
    job = spot_job(tmp_path, {"provider": "vast", "gpu": ["RTX 4090", "RTX A6000"], **servers},
                   export={"waive": True, "import_from": str(earlier)})

    def preempt() -> int:
        [instance] = fake_vast.serving()
        fake_vast.preempt(instance)
        # its disk goes with it (the fake's instances share one folder): a replacement finds only what it is given
        shutil.rmtree(servers["volume"], ignore_errors=True)
        return instance

    reporter = PreemptAt(preempt)
    summary = run_job(load_job(job), reporter=reporter)
    assert len(reporter.taken) == 2
    assert all("price" in c for c in fake_vast.creates)  # bids
    # each offer is one machine: the replacements come from the next offers
    assert [c["offer_id"] for c in fake_vast.creates] == [1001, 1002, 1003]
    check_finished_run(tmp_path / "out", summary, ledger, fake_vast.alive, len(fake_vast.creates))
    # each instance, the replacements too, was seeded from the export before its TEI started: no download
    assert [start["downloaded"] for start in fake_vast.starts.values()] == [False, False, False]
    assert all(start["waited_s"] < 29 for start in fake_vast.starts.values())  # on the marker, not the bound
    record = ledger.load(summary.run_id)
    assert record is not None
    assert [entry.get("imported") for entry in record["instances"].values()] == [str(earlier)] * 3


@pytest.mark.timeout(60)
def test_teardown_stops_a_replacement_being_rented(fake_vast: Any, ledger: Ledger) -> None:
    from teibatch.fleet import LaunchSpec
    from tests.fleet.test_vast import provider

    spot = provider(ledger, capacity="spot", startup_timeout=20.0)
    [endpoint] = spot.up(LaunchSpec(run_id="torn"))
    [instance] = fake_vast.serving()
    fake_vast.preempt(instance)
    [lost] = spot.lost()
    assert (lost.name, lost.url, lost.reason) == ("teibatch-torn-0", endpoint.url, "exited")
    assert spot.lost() == []  # said once
    fake_vast.stuck = 1  # the replacement stays loading: replace() waits for it
    replaced: list[Any] = []
    renting = threading.Thread(target=lambda: replaced.append(spot.replace([lost])))
    renting.start()
    deadline = time.monotonic() + 10
    while len(fake_vast.creates) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    began = time.monotonic()
    spot.down()
    renting.join(10)
    assert not renting.is_alive() and replaced == [[]]
    assert time.monotonic() - began < 10  # not the 20 s startup_timeout of the replacement
    assert fake_vast.alive() == 0
    record = ledger.load("torn")
    assert record is not None
    assert {name: entry["state"] for name, entry in record["instances"].items()} == {
        "teibatch-torn-0": "destroyed", "teibatch-torn-1": "destroyed"}


@pytest.mark.timeout(60)
def test_no_replacement_once_max_replacements_is_used_up(fake_runpod: Any, ledger: Ledger) -> None:
    from teibatch.fleet import LaunchSpec
    from tests.fleet.test_runpod import provider

    spot = provider(ledger, max_replacements=0)
    spot.up(LaunchSpec(run_id="budget"))
    [pod] = fake_runpod.serving()
    fake_runpod.stop_pod(pod)
    lost = spot.lost()
    assert [s.reason for s in lost] == ["EXITED"]
    assert spot.replace(lost) == []  # nothing rented: the lost pod is given back all the same
    assert len(fake_runpod.creates) == 1 and fake_runpod.alive() == 0
    spot.down()
    record = ledger.load("budget")
    assert record is not None
    assert [s["state"] for s in record["instances"]["teibatch-budget-0"]["steps"]][-2:] == ["lost", "destroyed"]
