"""Provider ssh against a real sshd with stand-in docker and nvidia-smi: launch, tunnel, export, destroy, faults."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from teibatch.errors import CapacityUnavailable, ExportFailed, TeardownIncomplete
from teibatch.fleet import ExportPlan, InstanceState, LaunchSpec, Ledger, SshHost, SshProvider, session
from tests.fleet.conftest import SshHostFixture

FAST = {"startup_timeout": 30.0}


def provider(host: SshHostFixture, ledger: Ledger, tmp_path: Path, **options: Any) -> SshProvider:
    hosts = [SshHost(**host.host(destroy_command=f"echo $TEIBATCH_HOST $TEIBATCH_INSTANCE >> {tmp_path}/destroyed"))]
    options = {"model_id": "BAAI/bge-small-en-v1.5", "volume": str(tmp_path / "volume"), **FAST, **options}
    return SshProvider(hosts, ledger=ledger, **options)


def destroyed(tmp_path: Path) -> list[str]:
    path = tmp_path / "destroyed"
    return path.read_text().splitlines() if path.exists() else []


def states(ledger: Ledger) -> list[str]:
    return [e.state.value for e in ledger.entries()]


def test_launch_tunnel_export_destroy(host: SshHostFixture, ledger: Ledger, tmp_path: Path) -> None:
    fleet = provider(host, ledger, tmp_path)
    spec = LaunchSpec(run_id="run-1", max_runtime=60)
    export = ExportPlan(to=str(tmp_path / "exports"))
    with session(fleet, spec, export) as endpoints:
        assert len(endpoints) == 1
        endpoint = endpoints[0]
        assert endpoint.url.startswith("http://127.0.0.1:")
        assert host.standin.running() == 1
        assert states(ledger) == ["healthy"]
        embed = httpx.post(f"{endpoint.url}/embed", json={"inputs": "hello"},
                           headers={"Authorization": f"Bearer {endpoint.api_key}"}, timeout=10)
        assert embed.status_code == 200
        assert httpx.post(f"{endpoint.url}/embed", json={"inputs": "x"}, timeout=10).status_code == 401
        assert fleet.up(spec) == endpoints  # idempotent by run tag: nothing launched twice
        [instance] = fleet.instances()  # found on the host by the run label
        assert (instance.id, instance.state, instance.details["gpu"]) == \
            ("teibatch-run-1-0", InstanceState.HEALTHY, "NVIDIA GeForce RTX 4090")
    assert host.standin.running() == 0
    assert [i.state for i in fleet.instances()] == [InstanceState.DESTROYED]
    [run] = host.standin.runs()
    assert run[:4] == ["run", "-d", "--name", "teibatch-run-1-0"]
    assert "teibatch.run=run-1" in run
    assert run[run.index("-p") + 1] == "127.0.0.1::80"  # the host's loopback only
    assert run[run.index("--gpus") + 1] == "all"
    assert run[run.index("-e") + 1] == "API_KEY"  # the name; the value came through stdin
    assert "ghcr.io/huggingface/text-embeddings-inference:89-1.9" in run  # RTX 4090: Ada Lovelace
    assert run[run.index("--entrypoint") + 1] == "timeout"
    assert run[run.index("--model-id") + 1] == "BAAI/bge-small-en-v1.5"
    assert host.standin.api_key() == endpoint.api_key
    assert all(endpoint.api_key not in " ".join(argv) for argv in host.standin.calls())
    # Export: the volume, byte for byte, with a verified manifest; then destroy.
    exported = tmp_path / "exports" / "teibatch-run-1-0"
    manifest = json.loads((exported / "_export.json").read_text())
    assert manifest["files"] and manifest["links"]
    for rel, info in manifest["files"].items():
        assert (exported / "data" / rel).read_bytes() == (tmp_path / "volume" / rel).read_bytes()
        assert info["size"] == (exported / "data" / rel).stat().st_size
    assert destroyed(tmp_path) == ["127.0.0.1 teibatch-run-1-0"]
    assert states(ledger) == ["destroyed"]
    steps = [s["state"] for s in ledger.load("run-1")["instances"]["teibatch-run-1-0"]["steps"]]
    assert steps == ["requested", "running", "healthy", "removed", "destroyed"]


def test_import_seeds_the_volume_so_nothing_is_downloaded(host: SshHostFixture, ledger: Ledger,
                                                          tmp_path: Path) -> None:
    first = provider(host, ledger, tmp_path)
    with session(first, LaunchSpec(run_id="first"), ExportPlan(to=str(tmp_path / "exports"))):
        pass
    second = provider(host, ledger, tmp_path, volume=str(tmp_path / "fresh-volume"))
    spec = LaunchSpec(run_id="second", import_from=str(tmp_path / "exports"))
    with session(second, spec, ExportPlan(waive=True)):
        pass
    assert [d["downloaded"] for d in host.standin.downloads()] == [True, False]
    weights = tmp_path / "fresh-volume" / "models--BAAI--bge-small-en-v1.5" / "snapshots" / "main"
    assert (weights / "model.safetensors").is_symlink()
    assert host.standin.running() == 0


def test_launch_fails(host: SshHostFixture, ledger: Ledger, tmp_path: Path) -> None:
    host.standin.configure(fail_run=True)
    with pytest.raises(CapacityUnavailable, match="could not select device driver"), \
            session(provider(host, ledger, tmp_path), LaunchSpec(run_id="r"), ExportPlan(waive=True)):
        pytest.fail("the block must not run without servers")
    assert host.standin.running() == 0
    assert states(ledger) == ["destroyed"]
    assert destroyed(tmp_path)  # the rented host is destroyed all the same


def test_health_never_comes(host: SshHostFixture, ledger: Ledger, tmp_path: Path) -> None:
    # servers.startup_timeout covers the probe and `docker run` too: it is long enough that a busy machine
    # (here a `docker run` that takes 5 s) still leaves the health wait its turn, whose end is checked.
    host.standin.configure(never_healthy=True, run_delay_s=5)
    fleet = provider(host, ledger, tmp_path)
    started = time.monotonic()
    with pytest.raises(CapacityUnavailable, match=f"did not answer /health within {FAST['startup_timeout']:.0f}s"), \
            session(fleet, LaunchSpec(run_id="r"), ExportPlan(waive=True)):
        pass
    assert time.monotonic() - started < FAST["startup_timeout"] + 60  # bounded: the deadline, then teardown
    assert host.standin.running() == 0
    assert host.standin.runs()  # it was launched, and removed
    assert states(ledger) == ["destroyed"]


@pytest.mark.parametrize("gpu, reason", [
    pytest.param("Tesla V100-SXM2-16GB, 7.0, 16384 MiB", "below compute capability 7.5", id="volta-refused"),
    pytest.param("NVIDIA GeForce RTX 2080, 7.5, 8192 MiB", "needs about", id="model-does-not-fit"),
    pytest.param(None, "found no NVIDIA GPU", id="no-gpu"),
])
def test_refused_gpu_launches_nothing(host: SshHostFixture, ledger: Ledger, tmp_path: Path, gpu: str | None,
                                      reason: str) -> None:
    host.standin.configure(gpu=gpu)
    fleet = provider(host, ledger, tmp_path, model_id="Qwen/Qwen3-Embedding-8B")
    with pytest.raises(CapacityUnavailable, match=reason), \
            session(fleet, LaunchSpec(run_id="r"), ExportPlan(waive=True)):
        pass
    assert host.standin.runs() == []


def test_job_crash_tears_down_and_keeps_the_error(host: SshHostFixture, ledger: Ledger, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="the job broke"), \
            session(provider(host, ledger, tmp_path), LaunchSpec(run_id="r"), ExportPlan(to=str(tmp_path / "x"))):
        raise RuntimeError("the job broke")
    assert host.standin.running() == 0
    assert states(ledger) == ["destroyed"]


def test_export_fails_then_nothing_is_destroyed_until_sweep(host: SshHostFixture, ledger: Ledger,
                                                             tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the export folder should be")
    fleet = provider(host, ledger, tmp_path, remove_volume=True)
    with pytest.raises(ExportFailed, match="kept, nothing holding data destroyed") as caught, \
            session(fleet, LaunchSpec(run_id="r", export_to=str(blocker)), ExportPlan(to=str(blocker))):
        pass
    assert isinstance(caught.value, TeardownIncomplete)
    assert "fleet sweep" in str(caught.value)
    assert host.standin.running() == 0  # the containers are gone all the same
    assert destroyed(tmp_path) == []    # the host is not
    assert (tmp_path / "volume").is_dir()
    assert states(ledger) == ["removed"]
    from teibatch.fleet import sweep

    [kept] = sweep(ledger)  # the export still fails: still kept
    assert kept.action == "kept"
    [done] = sweep(ledger, waive_export=True)
    assert done.action == "destroyed"
    assert destroyed(tmp_path) and not (tmp_path / "volume").exists()
    assert states(ledger) == ["destroyed"]
    assert sweep(ledger) == []


def test_host_side_deadline_stops_the_container(host: SshHostFixture, ledger: Ledger, tmp_path: Path) -> None:
    fleet = provider(host, ledger, tmp_path, startup_timeout=20.0, deadline_margin=-18.0)
    spec = LaunchSpec(run_id="r", max_runtime=1)  # the container gets 20 + 1 - 18 = 3 s
    endpoints = fleet.up(spec)
    try:
        assert endpoints and host.standin.running() == 1
        [run] = host.standin.runs()
        assert run[run.index("--entrypoint") + 1:][2:5] == ["-k", "30s", "3s"]
        assert host.standin.wait_running(0, timeout=15)  # nobody stopped it: it stopped itself
    finally:
        fleet.down()


def test_unreachable_host_is_named(ledger: Ledger, tmp_path: Path, client_key: Path) -> None:
    from teibatch.fleet.shell import free_port

    hosts = [SshHost(address="127.0.0.1", port=free_port(), key_file=str(client_key),
                     known_hosts=str(tmp_path / "kh"), host_key_checking="accept-new")]
    fleet = SshProvider(hosts, ledger=ledger, startup_timeout=10.0)
    with pytest.raises(CapacityUnavailable, match="could not connect or log in"), \
            session(fleet, LaunchSpec(run_id="r")):
        pass
    assert states(ledger) == ["destroyed"]  # nothing was started there, nothing to destroy
