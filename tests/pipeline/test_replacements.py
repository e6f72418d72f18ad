"""The server watch's own rules, with a provider and senders that only record what they are told.

The whole path (a fake cloud taking instances back, real senders and servers) is in
tests/fleet/test_preemption.py; here: what the watch says and does when a replacement cannot be had.
"""

from __future__ import annotations

from typing import Any

import pytest
import ray

from teibatch.endpoint import Endpoint
from teibatch.errors import CloudApiError
from teibatch.fleet import Capability, LostServer, Provider, ReplacesLost
from teibatch.pipeline.progress import SilentReporter
from teibatch.pipeline.replacements import ServerWatch, meet_replacements
from teibatch.pipeline.senders.plans import SenderPlan, SenderRef, ServerPlan
from teibatch.pipeline.summary import RunSummary
from teibatch.tei import ClientLimits, EmbedOptions

URL = "http://127.0.0.1:9"
LIMITS = ClientLimits(max_batch_size=4, max_inflight_inputs=8, payload_limit=20_000)


class Cloud(Provider, ReplacesLost):
    capabilities = frozenset({Capability.REPLACE})
    name = "testcloud"

    def __init__(self, lost: list[LostServer], replace_with: list[Endpoint] | Exception) -> None:
        self.to_lose = lost
        self.replace_with = replace_with
        self.replaced: list[list[LostServer]] = []

    def up(self, spec: Any = None) -> list[Endpoint]:
        return []

    def down(self) -> None:
        pass

    def lost(self) -> list[LostServer]:
        lost, self.to_lose = self.to_lose, []
        return lost

    def replace(self, lost: list[LostServer]) -> list[Endpoint]:
        self.replaced.append(lost)
        if isinstance(self.replace_with, Exception):
            raise self.replace_with
        return self.replace_with


@ray.remote
class Sender:
    """Records the calls a sender gets from the watch."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def lose(self, url: str, coming: bool, plan: SenderPlan) -> bool:
        self.calls.append(("lose", (url, coming)))
        return True

    def add(self, server: ServerPlan, plan: SenderPlan) -> None:
        self.calls.append(("add", (server.endpoint.url, [p.endpoint.url for p in plan.servers])))

    def not_coming(self, plan: SenderPlan) -> None:
        self.calls.append(("not_coming", None))

    def said(self) -> list[tuple[str, Any]]:
        return self.calls


class Heard(SilentReporter):
    def __init__(self) -> None:
        self.events: list[tuple[str, str]] = []

    def message(self, text: str, *, event: str = "message", **fields: Any) -> None:
        self.events.append((event, text))


def sender() -> SenderRef:
    plan = SenderPlan((ServerPlan(Endpoint(URL), LIMITS),), "/embed", EmbedOptions(), 384)
    return SenderRef(Sender.remote(), plan)  # type: ignore[attr-defined]


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("failure", [pytest.param(CloudApiError("create failed", status_code=500), id="raises"),
                                     pytest.param([], id="no-capacity")])
def test_a_replacement_that_cannot_be_had_releases_the_waiting_sender(failure: Any) -> None:
    cloud = Cloud([LostServer("teibatch-r-0", URL, "EXITED")], failure)
    ref, heard, summary = sender(), Heard(), RunSummary(run_id="r")
    watch = ServerWatch(cloud, [ref], lambda endpoints: [], heard, summary)
    assert watch.check() == 1
    assert ray.get(ref.actor.said.remote()) == [("lose", (URL, True)), ("not_coming", None)]
    assert [event for event, _ in heard.events] == ["server_lost", "server_not_replaced"]
    assert summary.replacements[0]["status"] == "not replaced" and summary.replacements[0]["why"]
    assert watch.check() == 0  # said once


@pytest.mark.usefixtures("ray_session")
def test_a_replacement_of_another_model_is_not_taken() -> None:
    new = Endpoint("http://127.0.0.1:10")
    cloud = Cloud([LostServer("teibatch-r-0", URL, "exited")], [new])

    class Met:
        model_id, dimension, servers = "other/model", 384, ()

    meet = meet_replacements(lambda endpoints: Met(), lambda server: LIMITS, "BAAI/bge-small-en-v1.5", 384)
    ref, heard, summary = sender(), Heard(), RunSummary(run_id="r")
    ServerWatch(cloud, [ref], meet, heard, summary).check()
    assert ray.get(ref.actor.said.remote())[-1] == ("not_coming", None)
    assert "other/model" in summary.replacements[0]["why"]


@pytest.mark.usefixtures("ray_session")
def test_a_replacement_joins_the_sender_that_lost_the_server() -> None:
    new = Endpoint("http://127.0.0.1:10")
    cloud = Cloud([LostServer("teibatch-r-0", URL, "exited")], [new])
    meet = meet_replacements(lambda endpoints: _met(endpoints), lambda server: LIMITS, "m", 384)
    ref, heard, summary = sender(), Heard(), RunSummary(run_id="r")
    ServerWatch(cloud, [ref], meet, heard, summary).check()
    assert ray.get(ref.actor.said.remote())[-1] == ("add", (new.url, [URL, new.url]))
    assert summary.replacements[0]["status"] == "replaced"
    assert summary.replacements[0]["replacement_url"] == new.url
    assert [event for event, _ in heard.events] == ["server_lost", "server_replaced"]


def _met(endpoints: list[Endpoint]) -> Any:
    from teibatch.pipeline.connect import ConnectedServer, Fleet
    from teibatch.tei.info import ServerInfo

    info = ServerInfo.from_json({"model_id": "m", "model_type": {"embedding": {"pooling": "mean"}},
                                 "max_client_batch_size": 4, "max_concurrent_requests": 8,
                                 "max_input_length": 512, "max_batch_tokens": 16384})
    return Fleet(servers=tuple(ConnectedServer(e, info) for e in endpoints), model_id="m", dimension=384,
                 route="/embed")
