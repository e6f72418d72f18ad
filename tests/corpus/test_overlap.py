"""Where a job's output lies relative to its corpus: apart, inside (left out of the listing), refused."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from teibatch.corpus import CorpusOptions, list_sources
from teibatch.corpus.overlap import exclusion_note, output_inside
from teibatch.errors import JobSpecError

S3 = {"client_kwargs": {"endpoint_url": "http://127.0.0.1:9"}}


@pytest.mark.parametrize(
    ("corpus", "output", "inside"),
    [
        pytest.param("data/c9", "data/c9/out", "out", id="folder"),
        pytest.param("data/c9/", "data/c9/runs/out/", "runs/out", id="trailing-slashes"),
        pytest.param("data/c9/**", "data/c9/out", "out", id="recursive-glob"),
        pytest.param("data/c9/*.jsonl", "data/c9/out", "out", id="glob"),
        pytest.param("data/c9", "data/c9-out", None, id="sibling-with-the-same-prefix"),
        pytest.param("data/c9", "elsewhere/out", None, id="apart"),
        pytest.param("data/c9/a.jsonl", "data/c9/out", None, id="single-file-beside-the-output"),
    ],
)
def test_local_output_inside_the_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus: str, output: str,
                                        inside: str | None) -> None:
    monkeypatch.chdir(tmp_path)  # relative paths, as a job file usually has them
    assert output_inside(CorpusOptions(corpus), output, {}) == inside


def test_a_symbolic_link_to_the_corpus_is_the_corpus(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert output_inside(CorpusOptions(str(tmp_path / "link")), str(tmp_path / "real" / "out"), {}) == "out"


@pytest.mark.parametrize(
    ("corpus", "output", "problem"),
    [
        pytest.param("data/c9", "data/c9", "is the corpus's own folder", id="equal"),
        pytest.param("data/c9/**", "data/c9/", "is the corpus's own folder", id="equal-to-the-glob-folder"),
        pytest.param("data/c9/docs", "data/c9", "lies inside the output", id="corpus-inside-the-output"),
        pytest.param("data/c9/a.jsonl", "data", "lies inside the output", id="corpus-file-inside-the-output"),
    ],
)
def test_output_that_is_or_holds_the_corpus_is_refused_naming_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   corpus: str, output: str, problem: str) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(JobSpecError, match=problem) as refused:
        output_inside(CorpusOptions(corpus), output, {})
    assert refused.value.key == "output.path"
    assert corpus in str(refused.value) and output in str(refused.value)
    assert refused.value.exit_code == 2


@pytest.mark.parametrize(
    ("corpus", "output", "output_storage", "inside"),
    [
        pytest.param("s3://bucket/docs", "s3://bucket/docs/out", S3, "out", id="prefix"),
        pytest.param("s3://bucket/docs/*.jsonl.gz", "s3://bucket/docs/vectors", {}, "vectors", id="glob"),
        pytest.param("s3://bucket/docs", "s3://other/docs/out", S3, None, id="another-bucket"),
        pytest.param("s3://bucket/docs", "s3://bucket/docs/out", {"client_kwargs": {"endpoint_url": "http://x:1"}},
                     None, id="another-endpoint"),
        pytest.param("s3://bucket/docs", "bucket/docs/out", {}, None, id="local-output-of-the-same-name"),
    ],
)
def test_object_store_output_inside_the_corpus(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, corpus: str,
                                               output: str, output_storage: dict[str, object],
                                               inside: str | None) -> None:
    pytest.importorskip("s3fs")
    monkeypatch.chdir(tmp_path)
    assert output_inside(CorpusOptions(corpus, storage_options=S3), output, output_storage) == inside


def test_the_output_is_left_out_of_a_folder_and_a_glob(tmp_path: Path, kit: Any) -> None:
    corpus = tmp_path / "c9"
    kit.write_jsonl(corpus / "a.jsonl", [{"text": "x"}])
    kit.write_jsonl(corpus / "out" / "runs" / "r.json", [{"text": "a run report"}])
    (corpus / "out" / "vectors").mkdir()
    (corpus / "out" / "vectors" / "part-1.parquet").write_bytes(b"PAR1")
    kit.write_jsonl(corpus / "outside.jsonl", [{"text": "y"}])  # same prefix, not the output
    for path in (str(corpus), str(corpus / "**")):
        _, everything = list_sources(CorpusOptions(path))
        assert "out/runs/r.json" in [f.path for f in everything]
        options = CorpusOptions(path, exclude=("out",))
        _, files = list_sources(options)
        assert [f.path for f in files] == ["a.jsonl", "outside.jsonl"]
        assert exclusion_note(options) == f"corpus: the output (out/) lies inside {path} and is left out of the corpus"
    assert exclusion_note(CorpusOptions(str(corpus))) is None
