"""The ``teibatch`` command: exit codes, messages, the quickstart."""

from __future__ import annotations

import socket
from pathlib import Path

import orjson
import pyarrow.dataset as ds
import pytest
import yaml
from click.testing import CliRunner

from teibatch import __version__
from teibatch.cli import main
from teibatch.corpus.builtin import load_builtin

REPO = Path(__file__).resolve().parent.parent


def write_job(tmp_path: Path, **spec: object) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_version() -> None:
    result = CliRunner().invoke(main, ["--version"])
    assert result.exit_code == 0
    assert __version__ in result.output


def test_every_command_has_help_with_examples() -> None:
    for command in ("run", "validate", "serve", "status", "gpus"):
        result = CliRunner().invoke(main, [command, "--help"])
        assert result.exit_code == 0, command
        assert "Example" in result.output, command


def test_validate_prints_defaults(tmp_path: Path) -> None:
    (tmp_path / "x.jsonl").write_text('{"text": "a document", "n": 3, "m": [1.5]}\n{"text": "two", "n": "x"}\n')
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "x.jsonl"), "keep_fields": ["n", "m"]},
                     output={"path": "out"})
    result = CliRunner().invoke(main, ["validate", str(path)])
    assert result.exit_code == 0, result.stderr
    assert "sampled 2 records of x.jsonl (jsonl); fields: text, n, m" in result.stderr
    assert "kept field types: n JSON text (int64, string disagree), m list<float64>" in result.stderr
    shown = yaml.safe_load(result.stdout)
    assert {k: shown["servers"][k] for k in ("provider", "count", "urls", "api_key_env", "startup_timeout")} == {
        "provider": "local", "count": 2, "urls": [], "api_key_env": None, "startup_timeout": 60.0}
    assert shown["model"]["truncate"] is True
    assert shown["corpus"]["keep_fields_types"] == "strict"


@pytest.mark.parametrize("command", [pytest.param("validate", id="validate"), pytest.param("run", id="run")])
def test_bad_job_exits_2_naming_file_key_and_line(tmp_path: Path, command: str) -> None:
    path = tmp_path / "job.yaml"
    path.write_text("corpus:\n  path: x\n  text_feild: body\noutput:\n  path: o\n")
    result = CliRunner().invoke(main, [command, str(path)])
    assert result.exit_code == 2
    assert f"error: {path}:3: corpus.text_feild: unknown key" in result.stderr
    assert "Traceback" not in result.output


def test_unset_api_key_variable_exits_2_before_anything_starts(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_SUCH_KEY_VAR", raising=False)
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "nowhere")}, output={"path": str(tmp_path / "out")},
                     servers={"provider": "static", "urls": ["http://127.0.0.1:9"], "api_key_env": "NO_SUCH_KEY_VAR"})
    result = CliRunner().invoke(main, ["run", str(path)])
    assert result.exit_code == 2
    assert "NO_SUCH_KEY_VAR is not set" in result.stderr


@pytest.mark.usefixtures("ray_session")
def test_run_with_no_server_answering_exits_1(tmp_path: Path) -> None:
    (tmp_path / "a.jsonl").write_text('{"text": "x"}\n')
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "a.jsonl")}, output={"path": str(tmp_path / "out")},
                     servers={"provider": "static", "urls": [f"http://127.0.0.1:{free_port()}"],
                              "startup_timeout": 1})
    result = CliRunner().invoke(main, ["run", str(path), "--quiet"])
    assert result.exit_code == 1
    assert "answered /health" in result.stderr


@pytest.mark.usefixtures("ray_session")
def test_fail_on_rejects_exits_1(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text('{"text": "x"}\n{"text": ""}\n')
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "c")}, output={"path": str(tmp_path / "out")},
                     servers={"provider": "local", "count": 1})
    plain = CliRunner().invoke(main, ["run", str(path), "-q"])
    assert plain.exit_code == 0, plain.output
    assert "1 documents embedded, 1 rejected (empty_text: 1)" in plain.stdout
    strict = CliRunner().invoke(main, ["run", str(path), "-q", "--fail-on-rejects",
                                       "--set", f"output.path={tmp_path / 'out2'}"])
    assert strict.exit_code == 1
    assert "1 documents were rejected" in strict.stderr


@pytest.mark.usefixtures("ray_session")
def test_quickstart_job(tmp_path: Path) -> None:
    out = tmp_path / "quickstart"
    result = CliRunner().invoke(main, ["run", str(REPO / "jobs" / "quickstart.yaml"),
                                       "--set", f"output.path={out}"])
    assert result.exit_code == 0, result.output
    assert "embedding" in result.stderr  # progress, as plain lines when not on a terminal
    assert result.stdout.startswith("done: ")
    table = ds.dataset(out / "vectors").to_table(columns=["id", "title", "source"])
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)) > 3000


@pytest.mark.slow  # the command starts a private Ray and local server processes
def test_long_documents_job(tmp_path: Path) -> None:
    out = tmp_path / "long-documents"
    result = CliRunner().invoke(main, ["run", str(REPO / "jobs" / "long-documents.yaml"),
                                       "--set", f"output.path={out}"])
    assert result.exit_code == 0, result.output
    sources = {record["title"]: record["text"] for record in load_builtin("builtin:stdlib-source").records}
    assert result.stdout.startswith(f"done: {len(sources):,} documents embedded as ")
    table = ds.dataset(out / "vectors").to_table(columns=["id", "doc_id", "char_start", "char_end", "text", "path"])
    ids = table.column("id").to_pylist()
    assert len(ids) == len(set(ids)) > 2 * len(sources)
    for row in table.to_pylist():  # each chunk: its title line, then its passage of the module's source
        assert row["text"] == f"{row['doc_id']}\n" + sources[row["doc_id"]][row["char_start"]:row["char_end"]]
    assert ds.dataset(out / "documents").count_rows() == len(sources)
    duckdb = pytest.importorskip("duckdb", reason="duckdb is not installed in this environment")
    readme = (REPO / "README.md").read_text()
    query = readme.split("<!-- long-documents-query -->")[1].split("```sql")[1].split("```")[0]
    found = duckdb.sql(query.replace("out/long-documents", str(out))).fetchall()
    assert len({row[0] for row in found}) == len(found) == 5 and found[0][0] == "json"


@pytest.mark.usefixtures("ray_session")
def test_status_table_and_json(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text("".join(f'{{"text": "doc {i}"}}\n' for i in range(12)) + '{"text": ""}\n')
    out = tmp_path / "out"
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "c"), "shard_docs": 5},
                     output={"path": str(out)}, servers={"provider": "local", "count": 1})
    assert CliRunner().invoke(main, ["run", str(path), "-q"]).exit_code == 0
    as_json = CliRunner().invoke(main, ["status", str(out), "--json"])
    assert as_json.exit_code == 0
    state = yaml.safe_load(as_json.stdout)
    assert state["shards"] == {"planned": 3, "committed": 3, "pending": 0, "stale": 0}
    assert state["documents"] == {"vectors": 12, "rejects": 1}
    assert state["last_run"]["status"] == "done"
    table = CliRunner().invoke(main, ["status", str(out)])
    assert "3 committed, 0 pending of 3" in table.stdout
    missing = CliRunner().invoke(main, ["status", str(tmp_path / "nothing")])
    assert missing.exit_code == 1
    assert "no _manifest.json" in missing.stderr


@pytest.mark.usefixtures("ray_session")
def test_output_inside_the_corpus_folder_is_left_out_and_a_second_run_finds_nothing_new(tmp_path: Path) -> None:
    corpus = tmp_path / "data" / "c9"
    corpus.mkdir(parents=True)
    (corpus / "a.jsonl").write_text("".join(f'{{"id": "d{i}", "text": "doc {i}"}}\n' for i in range(6)))
    path = write_job(tmp_path, corpus={"path": str(corpus), "id_field": "id"}, output={"path": str(corpus / "out")},
                     servers={"provider": "local", "count": 1})
    note = f"corpus: the output (out/) lies inside {corpus} and is left out of the corpus"
    checked = CliRunner().invoke(main, ["validate", str(path)])
    assert checked.exit_code == 0, checked.output
    assert note in checked.stderr.splitlines()
    first = CliRunner().invoke(main, ["run", str(path)])
    assert first.exit_code == 0, first.output
    assert first.stdout.startswith("done: 6 documents embedded, 0 rejected; 1 shards committed")
    assert sum(note in line for line in first.stderr.splitlines()) == 1
    second = CliRunner().invoke(main, ["run", str(path)])  # out/vectors and out/runs now exist
    assert second.exit_code == 0, second.output
    assert second.stdout.startswith("done: 0 documents embedded, 0 rejected; 0 shards committed, 1 already done")
    ids = ds.dataset(corpus / "out" / "vectors").to_table().column("id").to_pylist()
    assert sorted(ids) == [f"d{i}" for i in range(6)]
    assert ds.dataset(corpus / "out" / "rejects").to_table().num_rows == 0


@pytest.mark.parametrize(
    ("output", "problem"),
    [pytest.param("c9", "is the corpus's own folder", id="the-corpus-folder"),
     pytest.param(".", "lies inside the output", id="holding-the-corpus")],
)
def test_output_that_is_or_holds_the_corpus_exits_2_before_any_work(tmp_path: Path, output: str,
                                                                    problem: str) -> None:
    (tmp_path / "c9").mkdir()
    (tmp_path / "c9" / "a.jsonl").write_text('{"text": "x"}\n')
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "c9")}, output={"path": str(tmp_path / output)},
                     servers={"provider": "static", "urls": [f"http://127.0.0.1:{free_port()}"]})
    for command in ("validate", "run"):
        result = CliRunner().invoke(main, [command, str(path)])
        assert result.exit_code == 2, result.output
        assert problem in result.stderr and str(tmp_path / "c9") in result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c9", "job.yaml"]  # nothing written
    assert sorted(p.name for p in (tmp_path / "c9").iterdir()) == ["a.jsonl"]


@pytest.mark.usefixtures("ray_session")
def test_the_summary_line_counts_truncated_documents(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text('{"text": "short"}\n{"text": "' + "long " * 300 + '"}\n{"text": "x"}\n')
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "c")}, output={"path": str(tmp_path / "out")},
                     model={"truncate": False, "on_too_long": "truncate"},
                     servers={"provider": "local", "count": 1, "server_args": ["--max-input-length", "64"]})
    result = CliRunner().invoke(main, ["run", str(path), "-q"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("done: 3 documents embedded (1 truncated), 0 rejected;")
    assert ds.dataset(tmp_path / "out" / "vectors").to_table().column("truncated").to_pylist().count(True) == 1
    again = CliRunner().invoke(main, ["run", str(path), "-q", "--set", f"output.path={tmp_path / 'out2'}",
                                      "--set", "servers.server_args=[]"])
    assert again.stdout.startswith("done: 3 documents embedded, 0 rejected;")  # "0 truncated" is not said


@pytest.mark.usefixtures("ray_session")
def test_the_summary_line_counts_deduplicated_documents(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "a.jsonl").write_text('{"text": "same"}\n{"text": "other"}\n{"text": "same"}\n')
    path = write_job(tmp_path, corpus={"path": str(tmp_path / "c")}, output={"path": str(tmp_path / "out")},
                     servers={"provider": "local", "count": 1})
    result = CliRunner().invoke(main, ["run", str(path), "-q"])
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("done: 3 documents embedded (1 deduplicated), 0 rejected;")


@pytest.mark.usefixtures("ray_session")
def test_the_summary_line_counts_kept_documents_and_gives_the_rate_beside_the_embedding_time(tmp_path: Path) -> None:
    (tmp_path / "c").mkdir()
    corpus = tmp_path / "c" / "a.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "text": "doc {i}"}}\n' for i in range(6)))
    path = write_job(tmp_path, corpus={"path": str(corpus), "id_field": "id"}, output={"path": str(tmp_path / "out")},
                     servers={"provider": "local", "count": 1}, mode="incremental")
    first = CliRunner().invoke(main, ["run", str(path), "-q"])
    assert first.exit_code == 0, first.output
    line = first.stdout.splitlines()[0]
    assert line.startswith("done: 6 documents embedded, 0 rejected;")
    report = orjson.loads(next((tmp_path / "out" / "runs").glob("*.json")).read_bytes())
    total, embed = report["timings"]["total_s"], report["timings"]["embed_s"]
    rate = f"{report['throughput_docs_per_s']:,.0f}"
    assert line.endswith(f"; {total:.1f}s ({embed:.1f}s embedding, {rate} docs/s)"), line
    corpus.write_text(corpus.read_text().replace('"doc 5"', '"doc five"'))  # one changed document
    again = CliRunner().invoke(main, ["run", str(path), "-q"])
    assert again.exit_code == 0, again.output
    assert again.stdout.startswith("done: 1 documents embedded, 5 unchanged kept, 0 rejected;"), again.stdout


@pytest.mark.usefixtures("ray_session")
def test_underscored_files_are_embedded_and_what_is_left_out_is_listed(tmp_path: Path) -> None:
    corpus = tmp_path / "c"
    corpus.mkdir()
    (corpus / "_2024-01.jsonl").write_text("".join(f'{{"id": "jan{i}", "text": "january {i}"}}\n' for i in range(4)))
    (corpus / "2024-02.jsonl").write_text("".join(f'{{"id": "feb{i}", "text": "february {i}"}}\n' for i in range(4)))
    (corpus / ".draft.jsonl").write_text('{"id": "draft", "text": "not yet"}\n')
    (corpus / "_SUCCESS").write_text("")
    path = write_job(tmp_path, corpus={"path": str(corpus), "id_field": "id"}, output={"path": str(tmp_path / "out")},
                     servers={"provider": "local", "count": 1})
    left_out = {"count": 2, "by_rule": {"hidden": 1, "marker": 1}, "first": [".draft.jsonl", "_SUCCESS"]}
    planned = CliRunner().invoke(main, ["plan", str(path), "--json"])
    assert planned.exit_code == 0, planned.output
    assert yaml.safe_load(planned.stdout)["documents"] == 8
    assert yaml.safe_load(planned.stdout)["left_out"] == left_out
    checked = CliRunner().invoke(main, ["validate", str(path)])
    assert "corpus: 2 files left out (hidden 1, marker 1): .draft.jsonl, _SUCCESS" in checked.stderr.splitlines()
    ran = CliRunner().invoke(main, ["run", str(path)])
    assert ran.exit_code == 0, ran.output
    assert ran.stdout.startswith("done: 8 documents embedded")
    assert "corpus: 2 file(s) left out (see the report's corpus.left_out): .draft.jsonl, _SUCCESS" in ran.stdout
    ids = ds.dataset(tmp_path / "out" / "vectors").to_table().column("id").to_pylist()
    assert sorted(ids) == sorted([f"jan{i}" for i in range(4)] + [f"feb{i}" for i in range(4)])
    report = yaml.safe_load(next((tmp_path / "out" / "runs").glob("*.json")).read_text())
    assert report["corpus"]["left_out"] == left_out
