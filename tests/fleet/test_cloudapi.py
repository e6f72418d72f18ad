"""The GPU clouds' HTTP client (:mod:`teibatch.fleet.cloudapi`): pacing from the documented limits, 429s
waited out as the cloud asks and never read as "no capacity" or as a failed terminate. Run against the
fake Lambda Cloud API, with the real :class:`~teibatch.fleet.rental.Rental`."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from email.utils import formatdate

import pytest

from teibatch.fleet.cloudapi import ApiClient
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import Offer
from teibatch.fleet.providers.lambdacloud import LambdaApi
from teibatch.fleet.rental import Rental, Rented
from tests.fleet.conftest import lambda_client
from tests.fleet.fake_lambda import RATES, FakeLambda

SCALE = 0.05   # the documented limits, 20 times faster: a launch every 0.5 s


@pytest.fixture
def lambda_api(monkeypatch: pytest.MonkeyPatch, fast_polls: None) -> Iterator[tuple[FakeLambda, LambdaApi]]:
    with lambda_client(monkeypatch, 5.0) as pair:
        yield pair


def a10_offers(api: LambdaApi) -> tuple[Offer, ...]:
    offers = tuple(o for o in api.offers() if o.key == "gpu_1x_a10")
    assert len(offers) == 2
    return offers


@pytest.mark.parametrize(("headers", "seconds"), [
    pytest.param({"retry-after": "3"}, 3.0, id="seconds"),
    pytest.param({"retry-after": formatdate(1_000_010.0, usegmt=True)}, 10.0, id="http-date"),
    pytest.param({"ratelimit": "limit=10, remaining=0, reset=7"}, 7.0, id="ratelimit-reset"),
    pytest.param({}, None, id="none"),
])
def test_retry_after(headers: dict[str, str], seconds: float | None) -> None:
    from teibatch.fleet.cloudapi import retry_after

    assert retry_after(headers, now=1_000_000.0) == seconds


@pytest.mark.timeout(60)
def test_a_429_on_create_is_waited_out_not_read_as_no_capacity(lambda_api: tuple[FakeLambda, LambdaApi],
                                                               ledger: Ledger) -> None:
    fake, api = lambda_api
    offers = a10_offers(api)
    fake.forced_429["_launch"] = 2   # the next two launches: 429, Retry-After: 1
    rental = Rental(api, ledger, "busy")
    item = rental.rent("teibatch-busy-0", offers, lambda name, offer: api.launch(name, offer, "ci-key"))
    assert item is not None and item.offer == offers[0]      # the first offer, not the next one
    assert len(fake.limited) == 2 and fake.launch_attempts == [("gpu_1x_a10", offers[0].region)]
    assert rental.terminate_all() == [] and fake.alive() == 0


@pytest.mark.timeout(60)
def test_a_429_on_the_status_poll_after_terminate_is_no_teardown_failure(lambda_api: tuple[FakeLambda, LambdaApi],
                                                                         ledger: Ledger) -> None:
    fake, api = lambda_api
    rental = Rental(api, ledger, "poll")
    assert rental.rent("teibatch-poll-0", a10_offers(api)[:1], lambda n, o: api.launch(n, o, "ci-key")) is not None
    fake.forced_429["_get"] = 2
    assert rental.terminate_all() == []
    assert fake.alive() == 0 and len(fake.limited) == 2


@pytest.mark.timeout(60)
def test_launches_are_paced_under_the_documented_rate(lambda_api: tuple[FakeLambda, LambdaApi], ledger: Ledger,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fake, api = lambda_api
    fake.intervals = {key: seconds * SCALE for key, seconds in RATES.items()}
    monkeypatch.setattr(ApiClient, "pace_scale", SCALE)
    rental = Rental(api, ledger, "paced")
    offers = a10_offers(api)
    for n in range(3):
        assert rental.rent(f"teibatch-paced-{n}", offers, lambda name, o: api.launch(name, o, "ci-key")) is not None
    assert fake.limited == []            # no request over the limits, so no 429 at all
    assert [c["region_name"] for c in fake.creates] == [offers[0].region] * 3
    assert rental.terminate_all() == [] and fake.alive() == 0


@pytest.mark.timeout(60)
def test_count_servers_start_together_not_one_after_another(lambda_api: tuple[FakeLambda, LambdaApi],
                                                           ledger: Ledger) -> None:
    """Every server of a batch is served at once: four servers meet at a barrier only if all four are
    being served (started) at the same time; served one after another, the first waits there in vain."""
    fake, api = lambda_api
    count = 4
    together = threading.Barrier(count, timeout=20)
    started: list[float] = []

    def serve(item: Rented) -> bool:
        started.append(time.monotonic())
        try:
            together.wait()
        except threading.BrokenBarrierError:
            item.error = "served alone"
            rental.give_back(item)
            return False
        return True

    rental = Rental(api, ledger, "together")
    reasons = rental.fill(count, a10_offers(api), lambda name, o: api.launch(name, o, "ci-key"), serve,
                          startup_timeout=20, max_replacements=0)
    assert reasons == [] and len(started) == count
    assert rental.terminate_all() == [] and fake.alive() == 0
