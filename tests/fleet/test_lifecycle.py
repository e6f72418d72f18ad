"""The session's order and rules, with a provider that records what is asked of it."""

from __future__ import annotations

import os
import signal
from collections.abc import Mapping

import pytest

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, ExportFailed, TeardownIncomplete
from teibatch.fleet import ExportPlan, LaunchSpec, running, session, supports
from teibatch.fleet.base import Capability, DestroysHosts, ExportsVolumes, Provider


class Recorder(Provider, ExportsVolumes, DestroysHosts):
    """A provider whose every step is recorded; faults are set per test."""

    name = "recorder"
    capabilities = frozenset({Capability.LAUNCH, Capability.EXPORT, Capability.DESTROY})

    def __init__(self, *, fail: str | None = None, signal_in_down: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail
        self.signal_in_down = signal_in_down
        self.exported = False

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        self.calls.append("up")
        if self.fail == "up":
            raise CapacityUnavailable("no capacity")
        return [Endpoint("http://127.0.0.1:1", "k")]

    def down(self) -> None:
        self.calls.append("down")
        if self.signal_in_down:
            os.kill(os.getpid(), signal.SIGINT)  # held until the servers are removed
            self.calls.append("down finished")
        if self.fail == "down":
            raise TeardownIncomplete("a container is left")

    def export_volumes(self, to: str, *, storage_options: Mapping[str, object] | None = None,
                       timeout: float | None = None) -> list[str]:
        self.calls.append(f"export {to}")
        if self.fail == "export":
            raise ExportFailed("the copy did not verify")
        self.exported = True
        return [to]

    def destroy(self, *, waive_export: bool = False) -> list[str]:
        self.calls.append(f"destroy waive={waive_export}")
        return [] if self.exported or waive_export else ["instance-0"]


SPEC = LaunchSpec(run_id="r")


def test_order_on_success() -> None:
    provider = Recorder()
    with session(provider, SPEC, ExportPlan(to="mem://x")) as endpoints:
        assert endpoints[0].url == "http://127.0.0.1:1"
        provider.calls.append("work")
    assert provider.calls == ["up", "work", "down", "export mem://x", "destroy waive=False"]


def test_failed_up_still_tears_down() -> None:
    provider = Recorder(fail="up")
    with pytest.raises(CapacityUnavailable), session(provider, SPEC, ExportPlan(waive=True)):
        pass
    assert provider.calls == ["up", "down", "destroy waive=True"]


def test_export_failure_keeps_data_and_says_so() -> None:
    provider = Recorder(fail="export")
    with pytest.raises(ExportFailed, match=r"1 instance\(s\) kept.*instance-0.*did not verify"), \
            session(provider, SPEC, ExportPlan(to="mem://x")):
        pass
    assert provider.calls == ["up", "down", "export mem://x", "destroy waive=False"]


def test_waived_export_failure_destroys() -> None:
    provider = Recorder(fail="export")
    with session(provider, SPEC, ExportPlan(to="mem://x", waive=True)):
        pass
    assert provider.calls[-1] == "destroy waive=True"


def test_no_export_configured_keeps_data_unless_waived() -> None:
    with pytest.raises(ExportFailed, match="no verified export"), session(Recorder(), SPEC, ExportPlan()):
        pass


def test_teardown_error_wins_and_keeps_the_block_error_as_context() -> None:
    provider = Recorder(fail="down")
    with pytest.raises(TeardownIncomplete, match="a container is left") as caught, \
            session(provider, SPEC, ExportPlan(waive=True)):
        raise RuntimeError("the job broke")
    assert isinstance(caught.value.__context__, RuntimeError)


def test_ctrl_c_during_down_waits_for_it_then_interrupts() -> None:
    provider = Recorder(signal_in_down=True)
    with pytest.raises(KeyboardInterrupt), session(provider, SPEC, ExportPlan(waive=True)):
        pass
    assert provider.calls == ["up", "down", "down finished", "destroy waive=True"]


def test_capabilities_are_checked_not_assumed() -> None:
    from teibatch.fleet import LocalProvider, StaticProvider

    static = StaticProvider(["http://127.0.0.1:1"])
    assert not supports(static, Capability.EXPORT) and not supports(static, Capability.DESTROY)
    assert supports(LocalProvider(1), Capability.LAUNCH)
    assert supports(Recorder(), Capability.EXPORT)
    with running(Recorder()) as endpoints:  # the plain context: up and down, nothing else
        assert endpoints
