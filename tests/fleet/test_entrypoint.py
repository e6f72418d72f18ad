"""The image's own entrypoint always runs, on every provider, with the host-side deadline around it.

TEI's CUDA images start with ``/entrypoint.sh`` (it puts CUDA's compat libraries on ``LD_LIBRARY_PATH``
for an older host driver, then runs the router); the stand-in images have the same entrypoints and
record which program each container started with: the stand-in ``docker`` (providers ``ssh``,
``local`` with Docker, ``lambda``) in ``entrypoints.jsonl``, the container clouds' fakes in
``entrypoints``. A provider that starts ``text-embeddings-router`` in the entrypoint's place fails here.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from teibatch.fleet import ExportPlan, LaunchSpec, Ledger, LocalDockerProvider, SshHost, SshProvider, session
from teibatch.fleet.base import Provider
from tests.fleet.conftest import SshHostFixture, StandinState, install_standins

MODEL = "BAAI/bge-small-en-v1.5"
#: a provider, and what its containers started with (``ran``, or ``bypassed by <program>``)
Made = tuple[Provider, Callable[[], list[str]]]


def standin_entrypoints(state: StandinState) -> list[dict[str, Any]]:
    """What the stand-in docker recorded: per container, the program it started with and whether it is the
    image's own entrypoint."""
    path = state.root / "entrypoints.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def ssh(request: pytest.FixtureRequest, ledger: Ledger, tmp_path: Path) -> Made:
    host: SshHostFixture = request.getfixturevalue("host")
    fleet = SshProvider([SshHost(**host.host())], model_id=MODEL, volume=str(tmp_path / "volume"),
                        startup_timeout=30.0, ledger=ledger)
    return fleet, lambda: programs(standin_entrypoints(host.standin))


def local_docker(request: pytest.FixtureRequest, ledger: Ledger,
                 tmp_path: Path) -> Made:
    monkeypatch: pytest.MonkeyPatch = request.getfixturevalue("monkeypatch")
    bin_dir = install_standins(tmp_path / "docker")
    state = StandinState(tmp_path / "docker" / "standin")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("STANDIN_STATE", str(state.root))
    request.addfinalizer(state.kill_all)
    fleet = LocalDockerProvider(1, model_id=MODEL, ledger=ledger, volume=str(tmp_path / "vol"), startup_timeout=30)
    return fleet, lambda: programs(standin_entrypoints(state))


def lambda_cloud(request: pytest.FixtureRequest, ledger: Ledger,
                 tmp_path: Path) -> Made:
    from tests.fleet.test_lambda import provider

    request.getfixturevalue("fake_lambda")
    host: SshHostFixture = request.getfixturevalue("host")
    return provider(host, ledger, tmp_path), lambda: programs(standin_entrypoints(host.standin))


def vast(request: pytest.FixtureRequest, ledger: Ledger, tmp_path: Path) -> Made:
    from tests.fleet.test_vast import provider

    fake = request.getfixturevalue("fake_vast")
    return provider(ledger), lambda: fake_programs(fake.entrypoints)


def runpod(request: pytest.FixtureRequest, ledger: Ledger, tmp_path: Path) -> Made:
    from tests.fleet.test_runpod import provider

    fake = request.getfixturevalue("fake_runpod")
    return provider(ledger), lambda: fake_programs(fake.entrypoints)


def programs(records: list[dict[str, Any]]) -> list[str]:
    """``ran`` or what replaced the image's entrypoint, per container."""
    return ["ran" if r["ran"] else f"bypassed by {r['program']}" for r in records]


def fake_programs(started: dict[str, str]) -> list[str]:
    return ["ran" if program == "/entrypoint.sh" else f"bypassed by {program}" for program in started.values()]


@pytest.mark.slow
@pytest.mark.timeout(120)
@pytest.mark.parametrize("make", [
    pytest.param(ssh, id="ssh"),
    pytest.param(local_docker, id="local-docker"),
    pytest.param(lambda_cloud, id="lambda"),
    pytest.param(vast, id="vast"),
    pytest.param(runpod, id="runpod"),
])
def test_the_images_own_entrypoint_runs_under_the_deadline(make: Callable[..., Made], request: pytest.FixtureRequest,
                                                           ledger: Ledger, tmp_path: Path) -> None:
    fleet, started = make(request, ledger, tmp_path)
    with session(fleet, LaunchSpec(run_id="entry", max_runtime=60), ExportPlan(to=str(tmp_path / "exports"))) as up:
        assert len(up) == 1
    assert started() == ["ran"]
