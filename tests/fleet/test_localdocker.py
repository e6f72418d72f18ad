"""Provider local with a Docker engine, run against the stand-in docker on this machine's PATH."""

from __future__ import annotations

import os
import platform
from pathlib import Path

import httpx
import pytest

from teibatch.fleet import ExportPlan, LaunchSpec, Ledger, LocalDockerProvider, docker_engine_available, session
from teibatch.fleet.images import choose_image
from tests.fleet.conftest import StandinState, install_standins


@pytest.fixture
def standin(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> StandinState:
    bin_dir = install_standins(tmp_path / "docker")
    state = StandinState(tmp_path / "docker" / "standin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_STATE", str(state.root))
    yield state
    state.kill_all()


def test_engine_detection(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    no_engine = tmp_path / "no-engine"
    no_engine.mkdir()
    (no_engine / "docker").write_text("#!/bin/sh\necho 'Cannot connect to the Docker daemon' >&2\nexit 1\n")
    (no_engine / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", str(no_engine))
    assert not docker_engine_available()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    assert not docker_engine_available()


def test_cpu_image_on_this_machine(standin: StandinState, tmp_path: Path, ledger: Ledger) -> None:
    assert docker_engine_available()
    provider = LocalDockerProvider(2, model_id="sentence-transformers/all-MiniLM-L6-v2", ledger=ledger,
                                   volume=str(tmp_path / "vol"), startup_timeout=30)
    with session(provider, LaunchSpec(run_id="loc"), ExportPlan(to=str(tmp_path / "exports"))) as endpoints:
        assert len(endpoints) == 2 and standin.running() == 2
        for endpoint in endpoints:
            info = httpx.get(f"{endpoint.url}/info", timeout=10,
                             headers={"Authorization": f"Bearer {endpoint.api_key}"}).json()
            assert info["model_id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert standin.running() == 0
    runs = standin.runs()
    assert len(runs) == 2 and all("--gpus" not in run for run in runs)
    image = choose_image(None, platform.machine()).image
    assert all(image in run for run in runs)
    assert (tmp_path / "exports" / "teibatch-loc-0" / "_export.json").exists()
    assert {e.state.value for e in ledger.entries()} == {"destroyed"}
