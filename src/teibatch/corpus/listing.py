"""Expand a corpus path into a sorted list of source files, each with a fingerprint.

The path may be a local file or directory, a glob, any fsspec URL (``s3://bucket/docs/*.jsonl.gz``)
or a builtin sample corpus (``builtin:stdlib-docs``). Planning lists once; each shard task later
re-resolves only the corpus *root* (no listing) and opens its sources relative to it, so a shard
names its files by their path relative to the root and the same corpus at another URL plans the
same shard ids.
"""

from __future__ import annotations

import datetime as dt
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import fsspec
from fsspec.spec import AbstractFileSystem

from teibatch.corpus.builtin import is_builtin, load_builtin
from teibatch.corpus.records import CorpusOptions
from teibatch.errors import CorpusAccessDenied, CorpusError, CorpusMismatch
from teibatch.storage_errors import STORAGE_ERRORS, credentials_problem

_GLOB_CHARS = frozenset("*?[")
_CHECKSUM_KEYS = ("ETag", "etag", "checksum", "md5Hash", "md5", "crc32c", "sha256")
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated", "modified")


@dataclass(frozen=True)
class SourceFile:
    """One file of the corpus: ``path`` relative to the corpus root (POSIX), what ``fs`` calls it,
    and a ``fingerprint`` that stays the same while the file is unchanged."""

    path: str
    url: str
    fingerprint: str


@dataclass(frozen=True)
class CorpusRoot:
    """Where a corpus lives: its filesystem and root directory (``fs`` is ``None`` and ``root`` empty
    for builtins).

    ``pattern`` is the fs-native path the user gave (a glob, a directory or a file); ``kind`` says
    which: ``"builtin"``, ``"file"``, ``"dir"`` or ``"glob"``.
    """

    fs: AbstractFileSystem | None
    root: str
    pattern: str
    kind: str

    def url(self, relative: str) -> str:
        """The fs-native path of a source named relative to the root."""
        return posixpath.join(self.root, relative) if self.root else relative

    def relative(self, url: str) -> str:
        """The path of ``url`` relative to the root, with POSIX separators."""
        if self.root and url.startswith(self.root.rstrip("/") + "/"):
            return url[len(self.root.rstrip("/")) + 1:]
        return posixpath.basename(url) if self.kind == "file" else url.lstrip("/")


def resolve_root(options: CorpusOptions) -> CorpusRoot:
    """Find the corpus root without listing it: one ``info`` call for a plain path, none for a glob."""
    if is_builtin(options.path):
        return CorpusRoot(None, "", options.path, "builtin")
    try:
        fs, pattern = fsspec.core.url_to_fs(options.path, **options.storage_options)
    except (ImportError, ValueError) as exc:
        raise CorpusError(f"{options.path}: cannot open this storage: {exc}") from exc
    if has_glob(pattern):
        return CorpusRoot(fs, glob_root(pattern), pattern, "glob")
    try:
        info = fs.info(pattern)
    except FileNotFoundError as exc:
        raise CorpusMismatch("no such file or directory; check corpus.path", file=options.path) from exc
    except STORAGE_ERRORS as exc:
        raise _refused(options, "storage refused", exc) from exc
    if info.get("type") == "directory":
        return CorpusRoot(fs, pattern.rstrip("/"), pattern, "dir")
    return CorpusRoot(fs, posixpath.dirname(pattern), pattern, "file")


def _refused(options: CorpusOptions, what: str, exc: BaseException) -> CorpusError:
    """The error of a storage that refuses: a credentials problem is the job's configuration (exit 2),
    anything else (a store down, a network cut) a run that may go through later."""
    kind = CorpusAccessDenied if credentials_problem(exc) else CorpusError
    return kind(f"{options.path}: {what}: {exc}; check the storage's credentials and corpus.storage_options")


def list_sources(options: CorpusOptions) -> tuple[CorpusRoot, list[SourceFile]]:
    """The corpus root and its files sorted by relative path; ``CorpusMismatch`` when nothing matches.

    A directory is walked recursively, leaving out hidden (``.``) and ``_``-prefixed files and
    folders (``_SUCCESS``, ``.ipynb_checkpoints``); a glob leaves them out too (as a shell does)
    unless one of its own components starts with that character; a single file is taken as given.
    A directory or a glob also leaves out ``options.exclude`` (the job's output inside the corpus),
    so a run never reads its own vectors and reports back as documents.
    """
    root = resolve_root(options)
    if root.kind == "builtin":
        corpus = load_builtin(options.path)
        return root, [SourceFile(corpus.source, corpus.source, corpus.fingerprint)]
    assert root.fs is not None
    try:
        if root.kind == "glob":
            found = root.fs.glob(root.pattern, detail=True)
        elif root.kind == "dir":
            found = root.fs.find(root.pattern, withdirs=False, detail=True)
        else:
            found = {root.pattern: root.fs.info(root.pattern)}
    except STORAGE_ERRORS as exc:
        raise _refused(options, "storage refused the listing", exc) from exc
    hidden = _hidden_prefixes(root)
    files = []
    for url, info in found.items():
        if info.get("type", "file") != "file":
            continue
        relative = root.relative(url)
        if root.kind != "file" and (_is_hidden(relative, hidden) or _is_excluded(relative, options.exclude)):
            continue
        files.append(SourceFile(relative, url, fingerprint(info)))
    if not files:
        left_out = "hidden and _-prefixed files" + (f", and the output ({', '.join(options.exclude)}/)"
                                                     if options.exclude else "")
        raise CorpusMismatch(f"no file matches this corpus path ({left_out} are left out); check corpus.path",
                             file=options.path)
    files.sort(key=lambda f: f.path)
    return root, files


def fingerprint(info: Mapping[str, Any]) -> str:
    """A short string that stays equal while a file is unchanged: size plus ETag/checksum, else mtime."""
    size = info.get("size")
    for key in _CHECKSUM_KEYS:
        value = info.get(key)
        if value:
            return f"size={size};{key.lower()}={str(value).strip(chr(34))}"
    for key in _MTIME_KEYS:
        value = info.get(key)
        if value is not None:
            stamp = value.isoformat() if isinstance(value, (dt.datetime, dt.date)) else repr(value)
            return f"size={size};mtime={stamp}"
    return f"size={size}"


def has_glob(path: str) -> bool:
    """Whether ``path`` holds a wildcard (``*``, ``?``, ``[``)."""
    return any(ch in _GLOB_CHARS for ch in path)


def glob_root(pattern: str) -> str:
    """The directory part of a glob before its first wildcard component."""
    parts = pattern.split("/")
    for index, part in enumerate(parts):
        if has_glob(part):
            return "/".join(parts[:index])
    return posixpath.dirname(pattern)


def _hidden_prefixes(root: CorpusRoot) -> tuple[str, ...]:
    """Which of ``.``/``_`` start a hidden file or folder: both, less those a glob itself starts a
    component with (``data/_parts/*.jsonl``)."""
    tail = root.pattern[len(root.root):].lstrip("/").split("/") if root.kind == "glob" else []
    return tuple(char for char in "._" if not any(part.startswith(char) for part in tail))


def _is_hidden(relative: str, hidden: tuple[str, ...]) -> bool:
    return any(part.startswith(hidden) for part in relative.split("/"))


def _is_excluded(relative: str, exclude: tuple[str, ...]) -> bool:
    return any(relative == folder or relative.startswith(folder + "/") for folder in exclude)
