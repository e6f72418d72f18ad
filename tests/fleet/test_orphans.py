"""The orphan property: no sequence of cloud faults leaves a paid instance of a run running.

Per provider, at least :data:`SCHEDULES` seeded fault schedules drive the real rental machinery
(:class:`~teibatch.fleet.rental.Rental` and the provider's API client) against the provider's fake, whose
:class:`~tests.fleet.fakehttp.FaultSchedule` answers creates, polls, lists and terminates late after
acting, late without acting (client timeouts), with 429 bursts or 503s, and lists new instances only some
lists later. One schedule in :data:`KILL_EVERY` runs the create in a child driver that is SIGKILLed while
its create call is in flight or just after. Every schedule ends with teardown (or nothing, when the driver
was killed) and ``teibatch fleet sweep`` (faults off: the operator's sweep after the incident); then
the fake holds no live instance of the run, the ledger shows every instance of it destroyed, and the
fake's billed seconds no longer grow. The test prints schedules run, faults injected by kind, and
orphans: instances left live after teardown that teardown did not report (silent), and after the sweep.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from teibatch.fleet import rental as rental_module
from teibatch.fleet.base import InstanceState
from teibatch.fleet.cloudapi import ApiClient
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import Offer
from teibatch.fleet.rental import CloudApi, Rental
from teibatch.fleet.sweep import sweep
from tests.fleet.conftest import LAMBDA_KEY, RUNPOD_KEY, VAST_KEY
from tests.fleet.fakehttp import FakeApi, FaultSchedule

SCHEDULES = int(os.environ.get("TEIBATCH_ORPHAN_SCHEDULES", "200"))
KILL_EVERY = 8            # one schedule in 8 SIGKILLs its driver mid-create
CLIENT_TIMEOUT_S = 0.25   # the API client gives up after this…
FAULT_DELAY_S = 0.4       # …and a late or lost answer comes after this
FAULT_RATE = 0.15         # the share of requests that get a fault
IMAGE = "ghcr.io/huggingface/text-embeddings-inference:89-1.9"

#: provider → (the fake's handler names of create, poll/list and terminate; its late-listing attribute)
OPERATIONS = {
    "lambda": (("_launch", "_list", "_get", "_terminate"), "late_listing"),
    "runpod": (("_create", "_list", "_get", "_delete"), "late_polls"),
    "vast": (("_create", "_list", "_destroy"), "late_lists"),
}


def open_fake(provider: str, workdir: Path) -> FakeApi:
    """The provider's fake, spec-checked where a spec exists; its instances run no container."""
    from tests.fleet.cloudspec import load_spec

    if provider == "lambda":
        from tests.fleet.fake_lambda import FakeLambda

        return FakeLambda(LAMBDA_KEY)
    if provider == "runpod":
        from tests.fleet.fake_runpod import SPEC_FILE, FakeRunPod

        runpod = FakeRunPod(RUNPOD_KEY, workdir, load_spec(SPEC_FILE))
        runpod.containers = False
        return runpod
    from tests.fleet.fake_vast import SPEC_FILE as VAST_SPEC
    from tests.fleet.fake_vast import FakeVast

    vast = FakeVast(VAST_KEY, workdir, load_spec(VAST_SPEC))
    vast.containers = False
    return vast


def point_env_at(provider: str, fake: FakeApi, env: Callable[[str, str], Any]) -> None:
    """Key and API address of ``provider`` in the environment (``env(name, value)``), as a run reads them."""
    if provider == "lambda":
        env("LAMBDA_API_KEY", LAMBDA_KEY)
        env("TEIBATCH_LAMBDA_API_URL", f"{fake.url}/api/v1")
    elif provider == "runpod":
        env("RUNPOD_API_KEY", RUNPOD_KEY)
        env("TEIBATCH_RUNPOD_API_URL", f"{fake.url}/v2")
    else:
        env("VAST_API_KEY", VAST_KEY)
        env("TEIBATCH_VAST_API_URL", f"{fake.url}/api/v0")


def open_api(provider: str) -> CloudApi:
    """The provider's real API client, timing out after :data:`CLIENT_TIMEOUT_S`."""
    from teibatch.fleet.clouds import API_OPENERS

    opener: Any = API_OPENERS[provider]
    return opener(timeout=CLIENT_TIMEOUT_S)  # type: ignore[no-any-return]


def creator(provider: str, api: Any) -> Callable[[str, Offer], str]:
    """The create call of ``provider`` for a server named ``name`` from ``offer`` (a spec-valid body)."""
    if provider == "lambda":
        return lambda name, offer: str(api.launch(name, offer, "ci-key"))
    if provider == "runpod":
        return lambda name, offer: str(api.create({
            "name": name, "image": IMAGE, "gpu": {"id": offer.key, "count": 1}, "cloud": "SECURE", "disk": 20,
            "ports": ["80/tcp"], "env": {"API_KEY": "k"}, "args": "--model-id m --port 80"}).id)
    return lambda name, offer: str(api.create(offer, {
        "client_id": "me", "image": IMAGE, "label": name, "disk": 20, "runtype": "args", "onstart": "timeout",
        "args": ["-k", "5", "60", "/entrypoint.sh", "--model-id", "m", "--port", "80"],
        "env": {"API_KEY": "k", "-p 80:80": "1"}}))


def candidate_offers(provider: str, api: CloudApi) -> tuple[Offer, ...]:
    """Two offers or more to fall back along (Vast's are single machines: all of them)."""
    offers = api.offers()
    if provider == "lambda":
        return tuple(o for o in offers if o.key == "gpu_1x_a10")
    return tuple(offers[:3]) if provider == "runpod" else tuple(offers)


def rent_in_child(provider: str, ledger_dir: str, run_id: str, name: str) -> None:
    """The driver that gets SIGKILLed: rents ``name`` (``python -c`` runs this)."""
    api = open_api(provider)
    Rental(api, Ledger(ledger_dir), run_id).rent(name, candidate_offers(provider, api), creator(provider, api))
    time.sleep(60)   # never reached before the kill, unless the create was quick: then it waits to be killed


@dataclass
class Tally:
    schedules: int = 0
    kills: int = 0
    reported: int = 0          # teardowns that reported a problem (the sweep's to finish)
    silent_orphans: int = 0    # instances live after a teardown that reported nothing
    orphans: int = 0           # instances live after the sweep
    ledger_open: int = 0       # runs whose ledger shows an instance not destroyed after the sweep
    still_billed: int = 0      # runs whose billed seconds still grew after the sweep
    failed: list[int] = field(default_factory=list)   # the seeds of the schedules that broke the property


def live_of(fake: Any, run_id: str) -> int:
    """Live instances of the run in the fake (its own state: listed or not)."""
    prefix = f"teibatch-{run_id}-"
    with fake.lock:
        if hasattr(fake, "pods"):
            return sum(1 for p in fake.pods.values() if p["name"].startswith(prefix) and p["status"] != "TERMINATED")
        rows = fake.instances.values()
        if hasattr(fake, "taken"):
            return sum(1 for r in rows if str(r["label"]).startswith(prefix) and r["cur_state"] != "unloaded")
        return sum(1 for r in rows if str(r["name"]).startswith(prefix) and r["status"] != "terminated")


@pytest.fixture
def quick(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every wait of the rental machinery short, so one schedule takes well under a second."""
    monkeypatch.setattr(ApiClient, "pace_scale", 0.0)
    monkeypatch.setattr(ApiClient, "rate_limit_patience_s", 30.0)
    monkeypatch.setattr(rental_module, "POLL_S", 0.02)
    monkeypatch.setattr(rental_module, "LATE_LISTING_S", 1.5)
    monkeypatch.setattr(rental_module, "TERMINATE_TIMEOUT_S", 10.0)


@contextlib.contextmanager
def killed_driver(provider: str, ledger: Ledger, run_id: str, fake: FakeApi, rng: random.Random) -> Iterator[None]:
    """A child driver renting one server, SIGKILLed once its create call reached the fake (plus up to 1.5×
    the fault delay: before, during or just after the cloud's late answer)."""
    code = (f"from tests.fleet.test_orphans import rent_in_child; "
            f"rent_in_child({provider!r}, {str(ledger.directory)!r}, {run_id!r}, 'teibatch-{run_id}-0')")
    before = len(fake.requests)
    child = subprocess.Popen([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 60
        create = "POST" if provider != "vast" else "PUT"
        while not any(m == create for m, _, _ in fake.requests[before:]):
            assert child.poll() is None, child.stderr.read().decode() if child.stderr else ""
            assert time.monotonic() < deadline, "the child driver sent no create call"
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 1.5 * FAULT_DELAY_S))
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=30)
        yield
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()


def run_schedule(provider: str, fake: Any, api: CloudApi, ledger: Ledger, seed: int, tally: Tally,
                 injected: Counter[str]) -> None:
    """One seeded schedule: rent (or a killed driver), teardown, sweep; then check the property."""
    rng = random.Random(seed)
    run_id = f"s{seed}"
    operations, late_attr = OPERATIONS[provider]
    faults = FaultSchedule(seed, rate=FAULT_RATE, operations=operations, delay_s=FAULT_DELAY_S)
    setattr(fake, late_attr, rng.choice([0, 0, 1, 2, 3]))
    if provider == "vast":
        fake.taken.clear()   # every machine is free again
    ledger.begin(run_id, provider=provider, job=run_id, config={"kind": provider, "gpu": True, "ssh": {}},
                 export_to=None)
    tally.schedules += 1
    broken = [tally.silent_orphans, tally.orphans, tally.ledger_open, tally.still_billed]
    fake.faults = faults
    teardown_problems: list[str] = []
    if seed % KILL_EVERY == 0:
        tally.kills += 1
        faults.forced[operations[0]] = [rng.choice(["late_answer", "timeout", "late_answer"])]
        with killed_driver(provider, ledger, run_id, fake, rng):
            pass
    else:
        rental = Rental(api, ledger, run_id)
        offers = candidate_offers(provider, api) if provider == "vast" else OFFERS[provider]
        rental.fill(rng.randint(1, 3), offers, creator(provider, api), lambda item: True,
                    startup_timeout=2.0, max_replacements=0)
        teardown_problems = rental.terminate_all()
        if teardown_problems:
            tally.reported += 1
        elif live_of(fake, run_id):
            tally.silent_orphans += live_of(fake, run_id)
    fake.faults = None
    injected.update(faults.injected)
    results = sweep(ledger, run_id=run_id, force=True, waive_export=True)
    assert all(r.action in ("destroyed",) for r in results), (results, teardown_problems)
    tally.orphans += live_of(fake, run_id)
    record = ledger.load(run_id) or {}
    if any(e.get("state") != InstanceState.DESTROYED.value for e in record.get("instances", {}).values()):
        tally.ledger_open += 1
    billed = fake.billed_seconds(f"teibatch-{run_id}-")
    time.sleep(0.01)
    if fake.billed_seconds(f"teibatch-{run_id}-") > billed:
        tally.still_billed += 1
    if broken != [tally.silent_orphans, tally.orphans, tally.ledger_open, tally.still_billed]:
        tally.failed.append(seed)


OFFERS: dict[str, tuple[Offer, ...]] = {}


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("provider", ["lambda", "runpod", "vast"])
def test_no_fault_schedule_leaves_an_instance_running(provider: str, tmp_path: Path, ledger: Ledger,
                                                      monkeypatch: pytest.MonkeyPatch, quick: None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    fake = open_fake(provider, tmp_path)
    tally, injected = Tally(), Counter[str]()
    with fake:
        point_env_at(provider, fake, monkeypatch.setenv)
        api = open_api(provider)
        try:
            OFFERS[provider] = candidate_offers(provider, api)
            assert len(OFFERS[provider]) >= 2
            for seed in range(1, SCHEDULES + 1):
                run_schedule(provider, fake, api, ledger, seed, tally, injected)
        finally:
            api.close()
    faults = ", ".join(f"{kind} {injected[kind]}" for kind in sorted(injected))
    with capsys.disabled():
        print(f"\n{provider}: {tally.schedules} schedules ({tally.kills} with the driver SIGKILLed mid-create), "
              f"faults injected: {sum(injected.values())} ({faults}); teardowns that reported a problem: "
              f"{tally.reported}; silent orphans after teardown: {tally.silent_orphans}; orphans after the sweep: "
              f"{tally.orphans}; ledger open: {tally.ledger_open}; still billed: {tally.still_billed}; "
              f"seeds that broke the property: {tally.failed}")
    assert getattr(fake, "answer_problems", []) == [], "the fake answered outside the provider's spec"
    assert tally.schedules >= SCHEDULES and sum(injected.values()) > 0
    assert (tally.silent_orphans, tally.orphans, tally.ledger_open, tally.still_billed) == (0, 0, 0, 0), tally
