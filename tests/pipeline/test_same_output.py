"""An output refuses a job made with other options, naming each option that differs, stored and new."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest

from teibatch.errors import EXIT_REFUSED, OutputMismatch
from teibatch.job import JobSpec
from teibatch.pipeline import run_job
from tests.conftest import write_jsonl


def job_for(root: Path, *, corpus: dict[str, Any] | None = None, **sections: Any) -> JobSpec:
    """The job that made the module's output, with some options changed."""
    spec = {"name": "made-it", "corpus": {"path": str(root / "corpus"), "id_field": "id", "keep_fields": ["title"],
                                          **(corpus or {})},
            "servers": {"provider": "local", "count": 1}, "output": {"path": str(root / "out")}}
    for section, values in sections.items():
        spec[section] = {**spec.get(section, {}), **values}
    return JobSpec.model_validate(spec)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Path]:
    """A finished output of 12 documents; tests refused by it change nothing in it."""
    root = tmp_path_factory.mktemp("made")
    write_jsonl(root / "corpus" / "a.jsonl",
                [{"id": f"d{i}", "text": f"text {i}", "body": f"body {i}", "key": f"k{i}", "title": f"T{i}"}
                 for i in range(12)])
    run_job(job_for(root))
    yield root


def refusal(job: JobSpec) -> str:
    with pytest.raises(OutputMismatch) as caught:
        run_job(job)
    assert caught.value.exit_code == EXIT_REFUSED == 3
    return str(caught.value)


@pytest.mark.parametrize(("changes", "named"), [
    pytest.param({"model": {"normalize": False}}, 'model.normalize: stored true, this job false', id="normalize"),
    pytest.param({"output": {"vector_type": "float16"}}, 'output.vector_type: stored "float32", this job "float16"',
                 id="vector-type"),
    pytest.param({"model": {"id": "teibatch/hashing-384"}},
                 'model.id: stored null, this job "teibatch/hashing-384"',
                 id="model"),
    pytest.param({"model": {"dimensions": 128}}, "model.dimensions: stored null, this job 128", id="dimensions"),
    pytest.param({"model": {"truncate": False}}, "model.truncate: stored true, this job false", id="truncate"),
    pytest.param({"model": {"prompt_name": "query"}}, 'model.prompt_name: stored null, this job "query"',
                 id="prompt-name"),
    pytest.param({"model": {"truncation_direction": "left"}},
                 'model.truncation_direction: stored "right", this job "left"', id="truncation-direction"),
    pytest.param({"model": {"on_too_long": "truncate"}},
                 'model.on_too_long: stored "reject", this job "truncate"', id="on-too-long"),
    pytest.param({"corpus": {"text_field": "body"}}, 'corpus.text_field: stored "text", this job "body"',
                 id="text-field"),
    pytest.param({"corpus": {"id_field": "key"}}, 'corpus.id_field: stored "id", this job "key"', id="id-field"),
    pytest.param({"corpus": {"keep_fields": []}}, 'corpus.keep_fields: stored ["title"], this job []',
                 id="keep-fields"),
])
def test_each_changed_option_is_named_with_both_values(made: Path, changes: dict[str, Any], named: str) -> None:
    message = refusal(job_for(made, **changes))
    assert "holds vectors made with other model options or reading options" in message
    assert named in message, message
    key, stored = named.split(": stored ")[0], named.split(": stored ")[1].split(", this job")[0]
    assert f"--set {key}={stored}" in message  # what to do: the stored value, or another output
    assert "new output.path" in message
    assert message.count(": stored ") == 1, message  # only what changed


def test_several_changes_are_all_named(made: Path) -> None:
    message = refusal(job_for(made, model={"normalize": False, "prompt_name": "query"},
                              output={"vector_type": "float16"}))
    assert ('model.normalize: stored true, this job false; model.prompt_name: stored null, this job "query"; '
            'output.vector_type: stored "float32", this job "float16"') in message, message


def test_chunking_a_whole_document_output_is_refused_naming_the_chunking_options(made: Path) -> None:
    message = refusal(job_for(made, chunking={"strategy": "tokens"}))
    assert 'chunking.strategy: stored not recorded, this job "tokens"' in message, message
    assert "model." not in message.split("holds vectors")[1].split("Mixing")[0]


def test_a_job_without_chunking_keeps_the_fingerprint_of_outputs_made_before_it(made: Path) -> None:
    job = job_for(made)
    assert not any(key.startswith("chunking.") for key in job.output_options())
    assert job.output_fingerprint() == JobSpec.model_validate(
        {**job.model_dump(exclude={"chunking"}), "chunking": {"strategy": None}}).output_fingerprint()


@pytest.fixture(scope="module")
def chunked(tmp_path_factory: pytest.TempPathFactory, ray_session: None) -> Iterator[Path]:
    """A finished chunked output of 6 documents."""
    root = tmp_path_factory.mktemp("chunked")
    write_jsonl(root / "corpus" / "a.jsonl", [{"id": f"d{i}", "text": f"text {i} " * 20, "title": f"T{i}"}
                                              for i in range(6)])
    run_job(job_for(root, chunking={"strategy": "tokens", "max_tokens": 16}))
    yield root


@pytest.mark.parametrize(("chunking", "named"), [
    pytest.param({"strategy": "tokens", "max_tokens": 16, "overlap_tokens": 4},
                 "chunking.overlap_tokens: stored 0, this job 4", id="overlap"),
    pytest.param({"strategy": "sentences", "max_tokens": 16},
                 'chunking.strategy: stored "tokens", this job "sentences"', id="strategy"),
    pytest.param({"strategy": None}, 'chunking.strategy: stored "tokens", this job null', id="chunking-off"),
])
def test_a_chunked_output_refuses_other_chunking_options(chunked: Path, chunking: dict[str, Any], named: str) -> None:
    message = refusal(job_for(chunked, chunking=chunking))
    assert named in message, message


def test_the_manifest_keeps_the_options_themselves(made: Path) -> None:
    manifest = orjson.loads((made / "out" / "_manifest.json").read_bytes())
    assert manifest["options"] == job_for(made).output_options()
    assert manifest["options"]["model.normalize"] is True


@pytest.fixture
def old_output(made: Path, tmp_path: Path) -> Path:
    """A copy of the module's output whose manifest keeps only the options' digest (as before they were kept)."""
    shutil.copytree(made / "corpus", tmp_path / "corpus")
    shutil.copytree(made / "out", tmp_path / "out")
    path = tmp_path / "out" / "_manifest.json"
    manifest = orjson.loads(path.read_bytes())
    del manifest["options"]
    path.write_bytes(orjson.dumps(manifest))
    return tmp_path


def test_an_old_manifest_is_compared_with_what_its_parts_record(old_output: Path) -> None:
    message = refusal(job_for(old_output, model={"normalize": False}))
    assert "keeps only a digest of them" in message, message
    assert "records model.normalize: stored true, this job false" in message, message
    assert "--set model.normalize=true" in message
    # The model id (the job names none), the id and text fields are in no part: said, not guessed.
    assert "not recorded, so not compared: model.id, corpus.id_field, corpus.text_field" in message


def test_an_old_manifest_says_where_the_difference_must_be(old_output: Path) -> None:
    message = refusal(job_for(old_output, corpus={"text_field": "body"}))
    assert "keeps only a digest of them" in message, message
    assert "so what differs is among model.id, corpus.id_field, corpus.text_field" in message, message


def test_an_old_manifest_that_matches_gets_the_options_at_its_next_save(old_output: Path) -> None:
    summary = run_job(job_for(old_output))  # every shard committed: nothing to embed, the manifest is saved
    assert summary.shards_skipped == summary.shards_total == 1
    manifest = orjson.loads((old_output / "out" / "_manifest.json").read_bytes())
    assert manifest["options"] == job_for(old_output).output_options()


def test_max_tokens_given_as_the_number_a_stored_auto_became_is_the_same_output(tmp_path: Path,
                                                                                  ray_session: None) -> None:
    write_jsonl(tmp_path / "corpus" / "a.jsonl", [{"id": f"d{i}", "text": f"text {i} " * 200, "title": f"T{i}"}
                                                  for i in range(4)])
    first = run_job(job_for(tmp_path, chunking={"strategy": "tokens"}))  # max_tokens: auto
    manifest = orjson.loads((tmp_path / "out" / "_manifest.json").read_bytes())
    resolved = manifest["info"]["chunking"]["max_tokens"]
    assert isinstance(resolved, int) and first.shards_committed == 1
    again = run_job(job_for(tmp_path, chunking={"strategy": "tokens", "max_tokens": resolved}))
    assert (again.shards_committed, again.shards_skipped) == (0, 1)
    message = refusal(job_for(tmp_path, chunking={"strategy": "tokens", "max_tokens": resolved // 2}))
    assert f'chunking.max_tokens: stored "auto", this job {resolved // 2}' in message, message
