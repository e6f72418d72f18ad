"""Reading job files: bytes that are not UTF-8, duplicate keys, and errors in ``--set`` values."""

from __future__ import annotations

from pathlib import Path

import pytest

from teibatch.errors import JobSpecError
from teibatch.job import load_job
from teibatch.jobfile import MAX_PROBLEMS_SHOWN, load_job_file

MINIMAL = "corpus:\n  path: ./docs\noutput:\n  path: ./out\n"


def write(tmp_path: Path, content: str | bytes, name: str = "myjob.yaml") -> Path:
    path = tmp_path / name
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content, encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("content", "line", "words"),
    [
        pytest.param(b"corpus:\n  path: caf\xe9\noutput:\n  path: o\n", 2, "byte 0xe9 at column 12",
                     id="latin-1-byte"),
        pytest.param("name: x\n".encode("utf-16"), 1, "byte 0xff at column 1", id="utf-16-file"),
        pytest.param(b"corpus:\n  path: x\noutput:\n  path: o\n# \xe2\x82\n", 5, "byte 0xe2", id="cut-multibyte"),
    ],
)
def test_a_file_that_is_not_utf8_names_the_line_of_the_first_bad_byte(tmp_path: Path, content: bytes, line: int,
                                                                       words: str) -> None:
    path = write(tmp_path, content)
    with pytest.raises(JobSpecError, match="not UTF-8") as caught:
        load_job(path)
    error = caught.value
    assert (error.file, error.line, error.exit_code) == (str(path), line, 2)
    assert words in str(error) and str(error).startswith(f"{path}:{line}: ")


def test_a_control_character_names_its_line(tmp_path: Path) -> None:
    path = write(tmp_path, "corpus:\n  path: x\n  text_field: te\x07xt\noutput:\n  path: o\n")
    with pytest.raises(JobSpecError, match=r"#x0007") as caught:
        load_job(path)
    assert caught.value.line == 3


@pytest.mark.parametrize(
    ("text", "key", "line", "first"),
    [
        pytest.param(MINIMAL + "corpus:\n  path: again\n", "corpus", 5, 1, id="top-level"),
        pytest.param("corpus:\n  path: x\n  shard_docs: 5\n  text_field: t\n  shard_docs: 6\noutput:\n  path: o\n",
                     "corpus.shard_docs", 5, 3, id="nested"),
        pytest.param(MINIMAL + "servers:\n  provider: static\n  urls:\n    - url: http://127.0.0.1:1\n"
                     "      url: http://127.0.0.1:2\n", "servers.urls.0.url", 9, 8, id="in-a-list-item"),
        pytest.param(MINIMAL + "model: {normalize: true, normalize: false}\n", "model.normalize", 5, 5,
                     id="flow-mapping"),
    ],
)
def test_a_duplicate_key_names_file_key_and_the_second_line(tmp_path: Path, text: str, key: str, line: int,
                                                            first: int) -> None:
    path = write(tmp_path, text)
    with pytest.raises(JobSpecError, match="duplicate key") as caught:
        load_job(path)
    error = caught.value
    assert (error.file, error.key, error.line) == (str(path), key, line)
    assert f"first on line {first}" in str(error)


def test_keys_from_a_merge_may_be_overridden(tmp_path: Path) -> None:
    text = ("x-defaults: &defaults\n  shard_docs: 5\n  text_field: body\n"
            "corpus:\n  <<: *defaults\n  path: ./docs\n  shard_docs: 7\noutput:\n  path: o\n")
    raw = load_job_file(write(tmp_path, text))
    assert raw.data["corpus"] == {"shard_docs": 7, "text_field": "body", "path": "./docs"}


@pytest.mark.parametrize(
    ("override", "message", "key"),
    [
        pytest.param("corpus.shard_doc=5", "--set corpus.shard_doc=5: unknown key 'shard_doc' in corpus (known: path, ",
                     "corpus.shard_doc", id="unknown-key"),
        pytest.param("corpus.shard_docs=0", "--set corpus.shard_docs=0: Input should be greater than or equal to 1",
                     "corpus.shard_docs", id="bad-value"),
        pytest.param("colour=red", "--set colour=red: unknown key 'colour' (known: name, corpus, ", "colour",
                     id="unknown-section"),
        pytest.param("servers.provider=static", "--set servers.provider=static: provider static needs servers.urls",
                     "servers", id="section-made-by-set"),
        pytest.param("output.path=${NO_SUCH_VARIABLE}", "--set output.path=${NO_SUCH_VARIABLE}: environment variable "
                     "NO_SUCH_VARIABLE is not set", "output.path", id="unset-variable"),
        pytest.param("corpus.keep_fields=[a, b", "--set corpus.keep_fields=[a, b: the value is not valid YAML",
                     "corpus.keep_fields", id="not-yaml"),
        pytest.param("corpus.path.deep=1", "--set corpus.path.deep=1: corpus.path is not a section", "corpus.path",
                     id="not-a-section"),
    ],
)
def test_set_errors_name_the_command_line_not_a_file_line(tmp_path: Path, override: str, message: str,
                                                          key: str) -> None:
    path = write(tmp_path, MINIMAL)
    with pytest.raises(JobSpecError) as caught:
        load_job(path, [override], environ={})
    error = caught.value
    assert str(error).startswith(message)
    assert str(path) not in str(error)
    assert (error.file, error.line, error.key, error.exit_code) == (None, None, key, 2)


def test_a_file_error_stays_on_its_line_and_mentions_sets_that_touched_its_section(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL + "servers:\n  provider: local\n")
    with pytest.raises(JobSpecError) as caught:
        load_job(path, ["servers.provider=static"])
    assert (caught.value.file, caught.value.line, caught.value.key) == (str(path), 5, "servers")
    assert str(caught.value).endswith("(with --set servers.provider=static)")
    with pytest.raises(JobSpecError) as caught:
        load_job(write(tmp_path, MINIMAL + "limits:\n  max_runtime: soon\n"), ["corpus.shard_docs=5"])
    assert (caught.value.line, caught.value.key) == (6, "limits.max_runtime")
    assert "--set" not in str(caught.value)


def test_a_set_that_replaces_a_section_takes_its_lines_with_it(tmp_path: Path) -> None:
    path = write(tmp_path, "corpus:\n  path: x\n  shard_doc: 5\noutput:\n  path: o\n")
    with pytest.raises(JobSpecError, match=r"^--set corpus=\{path: y, colour: 1\}: unknown key 'colour'"):
        load_job(path, ["corpus={path: y, colour: 1}"])
    with pytest.raises(JobSpecError, match="unknown key 'shard_doc'") as caught:
        load_job(path, ["corpus.shard_docs=5"])  # the file's own mistake stays the file's
    assert caught.value.line == 3


def test_the_last_set_of_a_key_wins(tmp_path: Path) -> None:
    job = load_job(write(tmp_path, MINIMAL), ["corpus.shard_docs=0", "corpus.shard_docs=9"])
    assert job.corpus.shard_docs == 9


def test_every_problem_is_shown_each_at_its_option_or_line(tmp_path: Path) -> None:
    path = write(tmp_path, "corpus:\n  path: x\n  shard_docs: 0\noutput:\n  path: o\n")
    with pytest.raises(JobSpecError) as caught:
        load_job(path, ["servers.count=x", "client.max_batch_size=abc", "servers.urls=[1]"])
    lines = str(caught.value).splitlines()
    assert lines == [
        "4 problems:",
        f"  {path}:3: corpus.shard_docs: Input should be greater than or equal to 1",
        "  --set servers.count=x: Input should be a valid integer, unable to parse string as an integer",
        "  --set servers.urls=[1]: servers.urls.0: Input should be a valid dictionary or instance of "
        "StaticServerSection",
        # one problem for one value, though it fits neither of the key's two types
        "  --set client.max_batch_size=abc: Input should be a valid integer, unable to parse string as an "
        "integer; or 'auto'",
    ]
    assert (caught.value.file, caught.value.line, caught.value.key) == (str(path), 3, "corpus.shard_docs")


def test_every_bad_set_and_every_unset_variable_is_shown(tmp_path: Path) -> None:
    path = write(tmp_path, MINIMAL)
    with pytest.raises(JobSpecError) as caught:
        load_job(path, ["corpus.keep_fields=[a", "corpus.path.deep=1"])
    assert str(caught.value).splitlines()[1:] == [
        "  --set corpus.keep_fields=[a: the value is not valid YAML: expected ',' or ']', but got '<stream end>'",
        "  --set corpus.path.deep=1: corpus.path is not a section"]
    with pytest.raises(JobSpecError) as caught:
        load_job(write(tmp_path, "corpus:\n  path: ${NO_DIR}/x\noutput:\n  path: ${NO_OUT}\n"), environ={})
    assert [line.split(": ", 1)[1] for line in str(caught.value).splitlines()[1:]] == [
        "corpus.path: environment variable NO_DIR is not set (write ${NO_DIR:-default} to give a default)",
        "output.path: environment variable NO_OUT is not set (write ${NO_OUT:-default} to give a default)"]


@pytest.mark.parametrize(("count", "shown"), [pytest.param(MAX_PROBLEMS_SHOWN + 1, MAX_PROBLEMS_SHOWN + 1,
                                                           id="one-over-the-cap-is-shown"),
                                              pytest.param(30, MAX_PROBLEMS_SHOWN, id="a-long-list-is-cut")])
def test_a_long_list_of_problems_is_cut_but_never_hides_just_one(tmp_path: Path, count: int, shown: int) -> None:
    urls = "[" + ", ".join(str(i) for i in range(count)) + "]"
    with pytest.raises(JobSpecError) as caught:
        load_job(write(tmp_path, MINIMAL), ["servers.provider=static", f"servers.urls={urls}"])
    lines = str(caught.value).splitlines()
    assert lines[0] == f"{count} problems:"
    assert sum("servers.urls." in line for line in lines) == shown
    if shown < count:
        assert lines[-1].startswith(f"  and {count - shown} more not shown here")
    else:
        assert len(lines) == count + 1
