from __future__ import annotations

import os
from pathlib import Path

import pytest

from teibatch.corpus import CorpusOptions, list_corpus, list_sources
from teibatch.corpus.listing import fingerprint, resolve_root
from teibatch.errors import CorpusError


def test_directory_is_walked_recursively_sorted_skipping_hidden_and_markers(mixed_corpus: Path) -> None:
    root, files = list_sources(CorpusOptions(str(mixed_corpus)))
    assert root.kind == "dir"
    assert [f.path for f in files] == ["a.jsonl", "c.parquet", "notes.txt", "sub/b.jsonl.gz"]
    assert all(f.url.startswith(str(mixed_corpus)) for f in files)
    assert all(f.fingerprint.startswith("size=") and "mtime=" in f.fingerprint for f in files)


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param("", ["2024-02.jsonl", "_2024-01.jsonl", "pkg/__init__.jsonl", "pkg/mod.jsonl"], id="directory"),
        pytest.param("**/*.jsonl", ["2024-02.jsonl", "_2024-01.jsonl", "pkg/__init__.jsonl", "pkg/mod.jsonl"],
                     id="recursive-glob"),
        pytest.param("pkg/*.jsonl", ["__init__.jsonl", "mod.jsonl"], id="glob-in-subfolder"),
    ],
)
def test_underscored_files_are_read_and_what_is_left_out_is_counted(tmp_path: Path, pattern: str,
                                                                      expected: list[str]) -> None:
    for name in ("_2024-01.jsonl", "2024-02.jsonl", "pkg/__init__.jsonl", "pkg/mod.jsonl", ".hidden.jsonl",
                 ".git/x.jsonl", "_SUCCESS"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('{"text": "x"}\n')
    (tmp_path / "out" / "vectors").mkdir(parents=True)
    (tmp_path / "out" / "_manifest.json").write_text("{}")
    listing = list_corpus(CorpusOptions(str(tmp_path / pattern) if pattern else str(tmp_path), exclude=("out",)))
    assert [f.path for f in listing.files] == expected
    if pattern:  # a glob's left-out files are those it matches
        matched = [".git/x.jsonl", ".hidden.jsonl"] if pattern.startswith("**") else []
        assert list(listing.left_out.first) == matched
        return
    assert listing.left_out.counts == {"hidden": 2, "marker": 1, "output": 1}
    assert listing.left_out.first == (".git/x.jsonl", ".hidden.jsonl", "_SUCCESS", "out/_manifest.json")
    assert listing.left_out.describe().startswith("4 files left out (hidden 2, marker 1, output 1): .git/x.jsonl")


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param("*.jsonl", ["a.jsonl"], id="glob-top"),
        pytest.param("**/*.jsonl.gz", ["sub/b.jsonl.gz"], id="glob-recursive"),
        pytest.param("sub/*", ["b.jsonl.gz"], id="glob-in-subfolder"),
        pytest.param("c.parquet", ["c.parquet"], id="single-file"),
    ],
)
def test_globs_and_single_files(mixed_corpus: Path, pattern: str, expected: list[str]) -> None:
    _, files = list_sources(CorpusOptions(str(mixed_corpus / pattern)))
    assert [f.path for f in files] == expected


@pytest.mark.parametrize(
    "pattern",
    [
        pytest.param("nothing-*.jsonl", id="glob-without-match"),
        pytest.param("missing.jsonl", id="missing-file"),
        pytest.param("empty", id="only-hidden-files"),
    ],
)
def test_no_match_names_the_path(mixed_corpus: Path, pattern: str) -> None:
    (mixed_corpus / "empty" / ".logs").mkdir(parents=True)
    (mixed_corpus / "empty" / ".logs" / "a.jsonl").write_text("{}\n")
    (mixed_corpus / "empty" / ".a.jsonl").write_text("{}\n")
    path = str(mixed_corpus / pattern)
    with pytest.raises(CorpusError, match=r"no (such file|file matches)") as caught:
        list_sources(CorpusOptions(path))
    assert path in str(caught.value)


def test_fingerprint_is_stable_and_follows_changes(tmp_path: Path) -> None:
    path = tmp_path / "a.jsonl"
    path.write_text('{"text": "x"}\n')
    first = list_sources(CorpusOptions(str(path)))[1][0].fingerprint
    assert list_sources(CorpusOptions(str(path)))[1][0].fingerprint == first
    os.utime(path, (1_000_000, 1_000_000))
    assert list_sources(CorpusOptions(str(path)))[1][0].fingerprint != first


@pytest.mark.parametrize(
    ("info", "expected"),
    [
        pytest.param({"size": 3, "ETag": '"abc"', "LastModified": 1}, "size=3;etag=abc", id="etag-wins"),
        pytest.param({"size": 3, "mtime": 1.5}, "size=3;mtime=1.5", id="mtime"),
        pytest.param({"size": 3}, "size=3", id="size-only"),
    ],
)
def test_fingerprint_prefers_checksums(info: dict[str, object], expected: str) -> None:
    assert fingerprint(info) == expected


def test_builtin_is_one_source() -> None:
    root, files = list_sources(CorpusOptions("builtin:stdlib-docs"))
    assert root.kind == "builtin"
    assert [f.path for f in files] == ["builtin:stdlib-docs"]
    assert files[0].fingerprint.startswith("python-")


def test_unknown_builtin_names_the_known_ones() -> None:
    with pytest.raises(CorpusError, match="builtin:stdlib-docs"):
        list_sources(CorpusOptions("builtin:nope"))


def test_root_of_a_glob_needs_no_listing(tmp_path: Path) -> None:
    root = resolve_root(CorpusOptions(str(tmp_path / "does-not-exist" / "*.jsonl")))
    assert (root.kind, root.root) == ("glob", str(tmp_path / "does-not-exist"))


@pytest.mark.parametrize(
    ("pattern", "expected"),
    [
        pytest.param(".cache/*.jsonl", ["x.jsonl"], id="hidden-folder-named"),
        pytest.param(".*.jsonl", [".hidden.jsonl"], id="hidden-file-named"),
        pytest.param("*", ["a.jsonl", "c.parquet", "notes.txt"], id="star-skips-hidden-and-markers"),
    ],
)
def test_glob_takes_hidden_names_only_when_asked(mixed_corpus: Path, pattern: str,
                                                expected: list[str]) -> None:
    _, files = list_sources(CorpusOptions(str(mixed_corpus / pattern)))
    assert [f.path for f in files] == expected


@pytest.mark.parametrize(
    ("patterns", "expected"),
    [
        pytest.param(("_drafts",), ["_a.jsonl", "b.jsonl", "sub/_c.jsonl", "sub/b.bak.jsonl"], id="a-folder"),
        pytest.param(("*.bak.jsonl",), ["_a.jsonl", "_drafts/x.jsonl", "b.jsonl", "sub/_c.jsonl"], id="files-anywhere"),
        pytest.param(("_*", "*/_*"), ["b.jsonl", "sub/b.bak.jsonl"], id="every-underscored-name"),
    ],
)
def test_the_jobs_exclude_patterns_leave_files_out(tmp_path: Path, patterns: tuple[str, ...],
                                                   expected: list[str]) -> None:
    for name in ("_a.jsonl", "b.jsonl", "_drafts/x.jsonl", "sub/_c.jsonl", "sub/b.bak.jsonl"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text('{"text": "x"}\n')
    listing = list_corpus(CorpusOptions(str(tmp_path), exclude_globs=patterns))
    assert [f.path for f in listing.files] == expected
    assert listing.left_out.counts == {"excluded": 5 - len(expected)}
