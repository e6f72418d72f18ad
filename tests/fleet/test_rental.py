"""The shared rental machinery (:class:`~teibatch.fleet.rental.Rental`) against the fake Lambda Cloud API:
what a run rents is found again by the run's label, whatever the cloud answered."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from teibatch.fleet.base import InstanceState
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.providers.lambdacloud import LambdaApi
from teibatch.fleet.rental import Rental
from teibatch.fleet.sweep import sweep
from tests.fleet.conftest import lambda_client
from tests.fleet.fake_lambda import FakeLambda
from tests.fleet.fakehttp import FaultSchedule


@pytest.fixture
def lambda_api(monkeypatch: pytest.MonkeyPatch, fast_polls: None) -> Iterator[tuple[FakeLambda, LambdaApi]]:
    """The fake Lambda Cloud and a client of it whose calls time out after 1 s."""
    with lambda_client(monkeypatch, 1.0) as pair:
        yield pair


@pytest.mark.timeout(60)
@pytest.mark.parametrize("late_listing", [
    pytest.param(1, id="listed-after-the-look-up"),
    pytest.param(3, id="listed-only-during-teardown"),
])
def test_an_instance_listed_only_after_its_create_timed_out_is_terminated(
        lambda_api: tuple[FakeLambda, LambdaApi], ledger: Ledger, late_listing: int) -> None:
    fake, api = lambda_api
    # the first launch makes its instance but answers after the client gave up; the list shows it late
    fake.slow_launches, fake.launch_delay_s, fake.late_listing = 1, 3.0, late_listing
    offers = tuple(o for o in api.offers() if o.key == "gpu_1x_a10")
    assert len(offers) == 2   # two regions: the second is tried after the first timed out
    ledger.begin("late", provider="lambda", job="late", config={"kind": "lambda"}, export_to=None)
    rental = Rental(api, ledger, "late")
    item = rental.rent("teibatch-late-0", offers, lambda name, offer: api.launch(name, offer, "ci-key"))
    assert item is not None and fake.alive() == 2
    assert rental.terminate_all() == []
    assert fake.alive() == 0
    # each create call named its instance uniquely; both carry the run's label
    assert [c["name"] for c in fake.creates] == ["teibatch-late-0", "teibatch-late-0.1"]
    [entry] = [e for e in ledger.entries() if e.run_id == "late"]
    assert entry.state.value == "destroyed"


@pytest.mark.timeout(60)
def test_fleet_sweep_terminates_an_instance_listed_only_after_its_create_timed_out(
        lambda_api: tuple[FakeLambda, LambdaApi], ledger: Ledger) -> None:
    fake, api = lambda_api
    fake.slow_launches, fake.launch_delay_s, fake.late_listing = 1, 3.0, 1
    ledger.begin("swept", provider="lambda", job="swept", config={"kind": "lambda", "gpu": True, "ssh": {}},
                 export_to=None)
    rental = Rental(api, ledger, "swept")
    offers = tuple(o for o in api.offers() if o.key == "gpu_1x_a10")
    assert rental.rent("teibatch-swept-0", offers, lambda name, offer: api.launch(name, offer, "ci-key")) is not None
    assert fake.alive() == 2   # the driver stops here (killed): nothing is torn down
    [result] = sweep(ledger, run_id="swept", force=True, waive_export=True)
    assert result.action == "destroyed", result
    assert fake.alive() == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("faults", [
    pytest.param({"_terminate": ["late_answer"]}, id="terminate-answered-after-acting"),
    pytest.param({"_terminate": ["timeout"]}, id="terminate-not-answered-nor-done"),
    pytest.param({"_get": ["timeout", "timeout"]}, id="status-poll-not-answered"),
    pytest.param({"_list": ["timeout"]}, id="listing-not-answered"),
])
def test_teardown_sends_a_call_that_got_no_answer_again(lambda_api: tuple[FakeLambda, LambdaApi], ledger: Ledger,
                                                        faults: dict[str, list[str]]) -> None:
    """A terminate, status poll or listing at teardown that the cloud did not answer in time is asked again
    (a terminate sent twice is harmless): one lost answer is no reason to leave the instance to a sweep."""
    fake, api = lambda_api
    rental = Rental(api, ledger, "lost")
    offers = tuple(o for o in api.offers() if o.key == "gpu_1x_a10")
    assert rental.rent("teibatch-lost-0", offers, lambda name, offer: api.launch(name, offer, "ci-key")) is not None
    fake.faults = FaultSchedule(0, rate=0.0, operations=(), delay_s=1.5)   # past the client's 1 s
    fake.faults.forced = {operation: list(kinds) for operation, kinds in faults.items()}
    assert rental.terminate_all() == []
    assert fake.alive() == 0 and sum(fake.faults.injected.values()) == sum(map(len, faults.values()))


@pytest.mark.timeout(60)
def test_fleet_sweep_waits_for_the_instance_of_a_create_its_killed_driver_never_saw_answered(
        lambda_api: tuple[FakeLambda, LambdaApi], ledger: Ledger) -> None:
    """The driver wrote the server down and sent its create call, then was killed (SIGKILL) before the answer:
    the cloud made the instance and lists it only a few lists later. The sweep waits for it, not only for
    the creates the driver saw time out."""
    fake, api = lambda_api
    ledger.begin("killed", provider="lambda", job="killed", config={"kind": "lambda", "gpu": True, "ssh": {}},
                 export_to=None)
    offer = next(o for o in api.offers() if o.key == "gpu_1x_a10")
    # what Rental.rent writes before its create call, then the call itself (its answer lost with the driver)
    ledger.update("killed", "teibatch-killed-0", InstanceState.REQUESTED, cloud="lambda", create_sent=True,
                  cloud_name="teibatch-killed-0")
    fake.late_listing = 4
    api.launch("teibatch-killed-0", offer, "ci-key")
    [result] = sweep(ledger, run_id="killed", force=True, waive_export=True)
    assert result.action == "destroyed", result
    assert fake.alive() == 0
