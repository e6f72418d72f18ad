"""Every exit code the README documents, reached through the command line, each meaning one thing."""

from __future__ import annotations

import re
import socket
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner, Result

from teibatch.cli import main
from teibatch.server.testing import running_server
from teibatch.sink import OutputLock, OutputStore

README = Path(__file__).resolve().parents[1] / "README.md"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(tmp_path: Path, corpus: str | None = None, **sections: Any) -> Result:
    if corpus is None:
        corpus = str(tmp_path / "c")
        (tmp_path / "c").mkdir(exist_ok=True)
        (tmp_path / "c" / "a.jsonl").write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n')
    spec = {"corpus": {"path": corpus, "id_field": "id"}, "output": {"path": str(tmp_path / "out")},
            "servers": {"provider": "local", "count": 1}, **sections}
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return CliRunner().invoke(main, ["run", str(path), "-q"])


def test_the_readme_documents_exactly_these_codes() -> None:
    table = README.read_text().split("**Exit codes**", 1)[1].split("\n\n", 2)[1]
    assert re.findall(r"^\| `(\d)` \|", table, flags=re.MULTILINE) == ["0", "1", "2", "3", "4"]


@pytest.mark.usefixtures("ray_session")
def test_0_done(tmp_path: Path) -> None:
    result = run(tmp_path)
    assert result.exit_code == 0, result.stderr
    assert "2 documents embedded" in result.stdout


@pytest.mark.usefixtures("ray_session")
def test_1_not_finished_and_resumable(tmp_path: Path) -> None:
    result = run(tmp_path, servers={"provider": "static", "urls": [f"http://127.0.0.1:{free_port()}"],
                                    "startup_timeout": 1})
    assert result.exit_code == 1, result.stderr
    assert run(tmp_path).exit_code == 0  # the same job, servers back: it finishes


@pytest.mark.parametrize(("corpus", "expected"), [
    pytest.param("nowhere/*.jsonl", "nowhere", id="corpus-path-matches-nothing"),
    pytest.param("c/a.jsonl", "no field 'body'", id="text-field-missing"),
])
def test_2_the_job_or_corpus_is_wrong_before_anything_starts(tmp_path: Path, corpus: str, expected: str) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text('{"id": "a", "text": "one"}\n')
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump({"corpus": {"path": str(tmp_path / corpus), "text_field": "body"},
                                    "output": {"path": str(tmp_path / "out")},
                                    "servers": {"provider": "static", "urls": ["http://127.0.0.1:9"]}}))
    result = CliRunner().invoke(main, ["run", str(path), "-q"])
    assert result.exit_code == 2, result.stderr
    assert expected in result.stderr
    assert not (tmp_path / "out" / "runs").exists()  # nothing started, no run recorded


@pytest.mark.usefixtures("ray_session")
def test_3_refused_by_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXIT_CODE_TEST_KEY", "not-the-key")
    with running_server(api_key="the-key") as url:
        wrong_key = run(tmp_path, servers={"provider": "static", "urls": [url], "api_key_env": "EXIT_CODE_TEST_KEY"})
    assert wrong_key.exit_code == 3, wrong_key.stderr
    assert "EXIT_CODE_TEST_KEY" in wrong_key.stderr
    assert run(tmp_path).exit_code == 0
    other_options = run(tmp_path, model={"normalize": False})
    assert other_options.exit_code == 3, other_options.stderr
    assert "other model options" in other_options.stderr


@pytest.mark.usefixtures("ray_session")
def test_4_another_run_is_writing_this_output(tmp_path: Path) -> None:
    out = OutputStore(str(tmp_path / "out"))
    holder = OutputLock(out, "20261201-000000-busy")
    holder.acquire()  # this process stands for a run that is still going
    try:
        refused = run(tmp_path)
    finally:
        holder.release()
    assert refused.exit_code == 4, refused.stderr
    assert "20261201-000000-busy" in refused.stderr
    assert not (tmp_path / "out" / "runs").exists()  # nothing started, no run recorded
    assert run(tmp_path).exit_code == 0  # the other run is over: the same command works
