from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from teibatch.cli import main
from teibatch.errors import JobSpecError
from teibatch.job import load_job, parse_duration

MINIMAL = """\
corpus:
  path: ./docs/*.jsonl
output:
  path: ./out
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.yaml"
    path.write_text(text)
    return path


def test_minimal_job_gets_every_default(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL))
    assert job.servers.provider == "local"
    assert job.servers.count == 2
    assert job.model.truncate is True
    assert job.model.normalize is True
    assert job.corpus.shard_docs == 10_000
    assert job.corpus.text_field == "text"
    assert job.client.route == "auto"
    assert job.client.payload_limit == 2_000_000
    assert job.output.vector_type == "float32"
    assert job.output.compression == "zstd"


@pytest.mark.parametrize(("text", "key", "line", "words"), [
    pytest.param(MINIMAL + "colour: red\n", "colour", 5, "unknown key", id="unknown-top-level-key"),
    pytest.param("corpus:\n  path: x\n  shard_doc: 5\noutput:\n  path: o\n", "corpus.shard_doc", 3,
                 "unknown key 'shard_doc' in corpus (known: path, format", id="unknown-nested-key"),
    pytest.param("output:\n  path: o\n", "corpus", None, "required", id="missing-section"),
    pytest.param("corpus:\n  path: x\n  shard_docs: 0\noutput:\n  path: o\n", "corpus.shard_docs", 3,
                 "greater than or equal to 1", id="shard-docs-zero"),
    pytest.param("corpus:\n  path: x\n  format: xml\noutput:\n  path: o\n", "corpus.format", 3,
                 "jsonl", id="bad-format"),
    pytest.param(MINIMAL + "servers:\n  provider: static\n", "servers", 5, "servers.urls",
                 id="static-without-urls"),
    pytest.param(MINIMAL + "servers:\n  provider: static\n  urls: [ftp://x]\n", "servers.urls.0.url", 7,
                 "http://", id="static-bad-url"),
    pytest.param(MINIMAL + "limits:\n  max_runtime: soon\n", "limits.max_runtime", 6, "duration",
                 id="bad-duration"),
    pytest.param(MINIMAL + "chunking:\n  strategy: tokens\n  overlap: 5\n", "chunking.overlap", 7,
                 "unknown key 'overlap' in chunking (known: strategy, max_tokens, overlap_tokens",
                 id="chunking-unknown"),
    pytest.param(MINIMAL + "chunking:\n  strategy: words\n", "chunking.strategy", 6, "'paragraphs'",
                 id="chunking-strategy"),
    pytest.param(MINIMAL + "chunking:\n  overlap_tokens: 5\n", "chunking", 5,
                 "chunking.overlap_tokens is set but chunking is off", id="chunking-off-with-options"),
    pytest.param(MINIMAL + "chunking:\n  strategy: tokens\n  max_tokens: 64\n  overlap_tokens: 64\n", "chunking",
                 5, "overlap_tokens (64) must be below chunking.max_tokens (64)", id="chunking-overlap"),
    pytest.param(MINIMAL + "chunking:\n  strategy: tokens\n  max_tokens: many\n", "chunking.max_tokens", 7,
                 "auto", id="chunking-max-tokens"),
    pytest.param("corpus:\n  path: x\n  keep_fields: [doc_id]\noutput:\n  path: o\nchunking:\n  strategy: tokens\n",
                 None, None, "'doc_id', a column chunking writes itself", id="chunking-column-clash"),
    pytest.param("corpus:\n  path: x\noutput:\n  path: o\n  vector_type: int4\n", "output.vector_type", 5,
                 "'binary'", id="vector-type"),
    pytest.param("corpus:\n  path: x\noutput:\n  path: o\n  keep_float: true\n", "output", 3,
                 "with vector_type float32 the embedding column is that vector already", id="keep-float-f32"),
])
def test_bad_job_names_file_key_and_line(tmp_path: Path, text: str, key: str, line: int | None,
                                         words: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(JobSpecError) as caught:
        load_job(path)
    error = caught.value
    assert error.key == key
    assert error.line == line
    assert error.file == str(path)
    assert words in str(error)
    assert str(path) in str(error)
    assert error.exit_code == 2


def test_keep_float_joins_the_output_options_only_when_on(tmp_path: Path) -> None:
    plain = load_job(write(tmp_path, MINIMAL + "  vector_type: int8\n"))
    assert "output.keep_float" not in plain.output_options()
    both = load_job(write(tmp_path, MINIMAL + "  vector_type: int8\n  keep_float: true\n"))
    assert both.output_options()["output.keep_float"] is True
    assert both.output_fingerprint() != plain.output_fingerprint()


def test_chunking_is_off_by_default_and_joins_the_output_options_only_when_on(tmp_path: Path) -> None:
    plain = load_job(write(tmp_path, MINIMAL))
    assert not plain.chunking.enabled
    assert not [key for key in plain.output_options() if key.startswith("chunking.")]
    chunked = load_job(write(tmp_path, MINIMAL + "chunking:\n  strategy: sentences\n  overlap_tokens: 32\n"))
    assert chunked.chunking.max_tokens == "auto" and chunked.chunking.tokenizer == "auto"
    assert chunked.output_options()["chunking.overlap_tokens"] == 32
    assert chunked.output_options()["chunking.strategy"] == "sentences"
    assert "chunking.tokenizer" not in chunked.output_options()
    assert chunked.output_fingerprint() != plain.output_fingerprint()


def test_invalid_yaml_reports_line(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="not valid YAML") as caught:
        load_job(write(tmp_path, "corpus:\n  path: [unclosed\noutput: {}\n"))
    assert caught.value.line == 3


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(JobSpecError, match="cannot read the job file"):
        load_job(tmp_path / "nope.yaml")


def test_env_expansion_with_default_and_missing(tmp_path: Path) -> None:
    text = "corpus:\n  path: ${CORPUS_DIR}/x.jsonl\noutput:\n  path: ${OUT:-./default-out}\n"
    job = load_job(write(tmp_path, text), environ={"CORPUS_DIR": "/data"})
    assert job.corpus.path == "/data/x.jsonl"
    assert job.output.path == str(tmp_path / "default-out")  # relative to the job file's folder
    with pytest.raises(JobSpecError, match="CORPUS_DIR is not set") as caught:
        load_job(write(tmp_path, text), environ={})
    assert caught.value.key == "corpus.path"
    assert caught.value.line == 2


def test_set_overrides(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL), ["corpus.shard_docs=500", "servers.count=4",
                                               "model.prompt_name=query", "limits.max_runtime=1h30m"])
    assert job.corpus.shard_docs == 500
    assert job.servers.count == 4
    assert job.model.prompt_name == "query"
    assert job.limits.max_runtime == 5400
    with pytest.raises(JobSpecError, match=r"key\.path=value"):
        load_job(write(tmp_path, MINIMAL), ["noequals"])
    with pytest.raises(JobSpecError, match="unknown key") as caught:
        load_job(write(tmp_path, MINIMAL), ["corpus.nope=1"])
    assert caught.value.key == "corpus.nope"


@pytest.mark.parametrize(("text", "seconds"), [
    pytest.param("90", 90, id="bare-seconds"), pytest.param("90s", 90, id="s"),
    pytest.param("30m", 1800, id="m"), pytest.param("2h", 7200, id="h"),
    pytest.param("1h30m", 5400, id="h-m"),
])
def test_parse_duration(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


def test_fingerprint_tracks_vector_options(tmp_path: Path) -> None:
    base = load_job(write(tmp_path, MINIMAL))
    same = load_job(write(tmp_path, MINIMAL), ["servers.count=5", "corpus.shard_docs=7"])
    other = load_job(write(tmp_path, MINIMAL), ["model.normalize=false"])
    assert base.output_fingerprint() == same.output_fingerprint()
    assert base.output_fingerprint() != other.output_fingerprint()


def test_output_options_name_what_the_fingerprint_digests(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL), ["corpus.id_field=id", "corpus.keep_fields=[title]",
                                              "model.id=m/x", "model.prompt_name=query"])
    assert job.output_options() == {
        "model.id": "m/x", "model.normalize": True, "model.truncate": True, "model.truncation_direction": "right",
        "model.prompt_name": "query", "model.dimensions": None, "model.on_too_long": "reject",
        "corpus.id_field": "id", "corpus.text_field": "text", "corpus.keep_fields": ["title"],
        "output.vector_type": "float32"}
    # The digest earlier teibatch versions wrote into their manifests: their outputs keep matching.
    assert job.output_fingerprint() == "03434e7c06abc72b"
    assert load_job(write(tmp_path, MINIMAL)).output_fingerprint() == "21f087594bdbe65c"


@pytest.mark.parametrize(("setting", "says"), [
    pytest.param("model.dimensions=64", "remove model.dimensions", id="dimensions"),
    pytest.param("output.vector_type=float16", "output.vector_type float16 is for dense vectors", id="vector-type"),
    pytest.param("client.route=embed", "client.route embed is a dense route", id="route"),
    pytest.param("chunking.document_vector=mean", "chunking.document_vector: mean averages dense vectors",
                 id="document-vector"),
])
def test_sparse_vectors_refuse_options_that_only_apply_to_dense_ones(tmp_path: Path, setting: str, says: str) -> None:
    extra = ["chunking.strategy=tokens"] if setting.startswith("chunking.") else []
    load_job(write(tmp_path, MINIMAL), [setting, *extra])  # fine for dense vectors, and for auto until a SPLADE model
    with pytest.raises(JobSpecError, match=says) as caught:
        load_job(write(tmp_path, MINIMAL), ["model.kind=sparse", setting, *extra])
    assert caught.value.exit_code == 2


def test_model_kind_leaves_the_fingerprint_alone(tmp_path: Path) -> None:
    fingerprints = {load_job(write(tmp_path, MINIMAL), [f"model.kind={kind}"]).output_fingerprint()
                    for kind in ("auto", "dense", "sparse")}
    assert fingerprints == {load_job(write(tmp_path, MINIMAL)).output_fingerprint()}


def test_shipped_jobs_are_valid() -> None:
    for path in sorted((Path(__file__).parent.parent / "jobs").glob("*.yaml")):
        load_job(path, environ={"TEI_API_KEY": "x", "GPU_HOST_1": "127.0.0.1", "GPU_HOST_2": "127.0.0.1"})


def test_static_urls_plain_or_with_their_own_payload_limit(tmp_path: Path) -> None:
    text = MINIMAL + ("servers:\n  provider: static\n  urls:\n    - http://127.0.0.1:8080/\n"
                      "    - {url: 'http://127.0.0.1:8081', payload_limit: 50000}\n"
                      "client:\n  max_input_length: 128\n")
    job = load_job(write(tmp_path, text))
    assert [(s.url, s.payload_limit) for s in job.servers.urls] == [
        ("http://127.0.0.1:8080", None), ("http://127.0.0.1:8081", 50000)]
    assert job.client.max_input_length == 128


def test_corpus_on_bad_file(tmp_path: Path) -> None:
    assert load_job(write(tmp_path, MINIMAL)).corpus_options().on_bad_file == "fail"
    job = load_job(write(tmp_path, MINIMAL), ["corpus.on_bad_file=reject"])
    assert job.corpus_options().on_bad_file == "reject"
    with pytest.raises(JobSpecError, match=r"^--set corpus.on_bad_file=skip: Input should be 'fail' or 'reject'"):
        load_job(write(tmp_path, MINIMAL), ["corpus.on_bad_file=skip"])


def test_corpus_keep_fields_types(tmp_path: Path) -> None:
    assert load_job(write(tmp_path, MINIMAL)).corpus_options().keep_fields_types == "strict"
    job = load_job(write(tmp_path, MINIMAL), ["corpus.keep_fields_types=stringify"])
    assert job.corpus_options().keep_fields_types == "stringify"
    with pytest.raises(JobSpecError, match=r"^--set corpus.keep_fields_types=loose: Input should be 'strict' or "
                                           r"'stringify'"):
        load_job(write(tmp_path, MINIMAL), ["corpus.keep_fields_types=loose"])


def test_relative_paths_in_a_job_file_are_taken_from_its_folder(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    (project / "data").mkdir(parents=True)
    (project / "data" / "a.jsonl").write_text('{"id": "a", "text": "one"}\n')
    (project / "job.yaml").write_text("corpus:\n  path: data\noutput:\n  path: out\nexport:\n  to: ./volumes\n"
                                      "  import_from: s3://bucket/volumes\nchunking:\n  tokenizer: auto\n"
                                      "servers:\n  provider: ssh\n  hosts:\n    - {address: h, key_file: keys/id, "
                                      "known_hosts: ~/.ssh/known_hosts}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    job = load_job(Path("..") / "project" / "job.yaml", ["servers.inventory=hosts.yaml"])
    assert Path(job.corpus.path).resolve() == project / "data"
    assert Path(job.output.path).resolve() == project / "out"
    assert Path(job.export.to or "").resolve() == project / "volumes"
    assert Path(job.servers.hosts[0].key_file or "").resolve() == project / "keys" / "id"
    # URLs, ~ paths, rule names and values given with --set (the current folder's) stay as written
    assert (job.export.import_from, job.servers.hosts[0].known_hosts) == ("s3://bucket/volumes", "~/.ssh/known_hosts")
    assert (job.chunking.tokenizer, job.servers.inventory) == ("auto", "hosts.yaml")
    result = CliRunner().invoke(main, ["validate", str(project / "job.yaml"), "--set", "servers.provider=local",
                                       "--set", "servers.hosts=[]"])
    assert result.exit_code == 0, result.output
    assert "sampled 1 record of a.jsonl" in result.stderr


def test_set_chunking_strategy_null_turns_chunking_off(tmp_path: Path) -> None:
    text = MINIMAL + "chunking:\n  strategy: tokens\n  max_tokens: 128\n  overlap_tokens: 16\n  title_field: title\n"
    assert load_job(write(tmp_path, text)).chunking.enabled
    job = load_job(write(tmp_path, text), ["chunking.strategy=null"])
    assert not job.chunking.enabled and job.chunking.max_tokens == "auto"
    # a chunking key given on the command line beside it is still refused, naming that option
    with pytest.raises(JobSpecError, match=r"chunking.prefix is set but chunking is off: .* remove chunking.prefix "
                                           r"\(with --set chunking.strategy=null, --set chunking.prefix=x\)"):
        load_job(write(tmp_path, text), ["chunking.strategy=null", "chunking.prefix=x"])


def test_relative_paths_in_an_inventory_are_taken_from_its_folder(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "project" / "hosts").mkdir(parents=True)
    (tmp_path / "project" / "hosts" / "gpus.yaml").write_text(
        "- {address: h1, key_file: keys/id}\n- {address: h2, key_file: ~/.ssh/id, known_hosts: /etc/known}\n")
    (tmp_path / "project" / "job.yaml").write_text("corpus: {path: data}\noutput: {path: out}\n"
                                                   "servers: {provider: ssh, inventory: hosts/gpus.yaml}\n")
    monkeypatch.chdir(tmp_path)
    job = load_job(Path("project") / "job.yaml")
    hosts = job.servers.host_sections()
    assert Path(hosts[0].key_file or "").resolve() == tmp_path / "project" / "hosts" / "keys" / "id"
    assert (hosts[1].key_file, hosts[1].known_hosts) == ("~/.ssh/id", "/etc/known")


def test_corpus_exclude_reaches_the_listing(tmp_path: Path) -> None:
    assert load_job(write(tmp_path, MINIMAL)).corpus_options().exclude_globs == ()
    job = load_job(write(tmp_path, MINIMAL), ["corpus.exclude=[_drafts, '*.bak']"])
    assert job.corpus_options().exclude_globs == ("_drafts", "*.bak")
