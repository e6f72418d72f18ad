"""Expand a corpus path into a sorted list of source files, each with a fingerprint.

The path may be a local file or directory, a glob, any fsspec URL (``s3://bucket/docs/*.jsonl.gz``)
or a builtin sample corpus (``builtin:stdlib-docs``). Planning lists once; each shard task later
re-resolves only the corpus *root* (no listing) and opens its sources relative to it, so a shard
names its files by their path relative to the root and the same corpus at another URL plans the
same shard ids.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
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
MARKER_FILES = frozenset({"_SUCCESS", "_metadata", "_common_metadata"})
"""Names that Spark, Hadoop and pyarrow write beside their data and that are never documents."""
LEFT_OUT_SHOWN = 5
"""How many left-out paths a listing names (it counts them all)."""


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


@dataclass(frozen=True)
class LeftOut:
    """What a listing matched but does not read: how many paths per rule, and the first few of them.

    Rules: ``hidden`` (a file or folder whose name starts with ``.``), ``marker`` (one of
    :data:`MARKER_FILES`), ``output`` (the job's output inside the corpus, ``options.exclude``),
    ``excluded`` (the job's ``corpus.exclude`` patterns, ``options.exclude_globs``).
    """

    counts: dict[str, int] = field(default_factory=dict, hash=False)
    first: tuple[str, ...] = ()

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> str:
        """One line for a person: ``3 files left out (hidden 2, output 1): .a.jsonl, ...``."""
        if not self.total:
            return "no file left out"
        rules = ", ".join(f"{rule} {count}" for rule, count in sorted(self.counts.items()))
        more = f", and {self.total - len(self.first)} more" if self.total > len(self.first) else ""
        return (f"{self.total} file{'s' if self.total != 1 else ''} left out ({rules}): "
                f"{', '.join(self.first)}{more}")

    def to_json(self) -> dict[str, Any]:
        return {"count": self.total, "by_rule": dict(sorted(self.counts.items())), "first": list(self.first)}


@dataclass(frozen=True)
class Listing:
    """A corpus listed: its root, the files it reads (sorted by relative path), and what it left out."""

    root: CorpusRoot
    files: list[SourceFile]
    left_out: LeftOut


def list_sources(options: CorpusOptions) -> tuple[CorpusRoot, list[SourceFile]]:
    """The corpus root and its files sorted by relative path (:func:`list_corpus` without what it left out)."""
    listing = list_corpus(options)
    return listing.root, listing.files


def list_corpus(options: CorpusOptions) -> Listing:
    """List the corpus; ``CorpusMismatch`` when nothing is left to read.

    A directory is walked recursively and a glob expanded; both read every file they match, ``_``-prefixed
    ones included (``_2024-01.jsonl``, ``__init__.py``), and leave out only hidden (``.``) files and
    folders (``.ipynb_checkpoints``, ``.git``; a glob reads them when one of its own components starts
    with ``.``), the :data:`MARKER_FILES`, ``options.exclude`` (the job's output inside the corpus,
    so a run never reads its own vectors, manifest and reports back as documents) and what the job's
    ``corpus.exclude`` patterns match (``options.exclude_globs``). What is left out is
    counted in :attr:`Listing.left_out`, for ``plan``, ``validate`` and the run to say. A single file
    is taken as given.
    """
    root = resolve_root(options)
    if root.kind == "builtin":
        corpus = load_builtin(options.path)
        return Listing(root, [SourceFile(corpus.source, corpus.source, corpus.fingerprint)], LeftOut())
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
    skipped: dict[str, list[str]] = {}
    for url, info in found.items():
        if info.get("type", "file") != "file":
            continue
        relative = root.relative(url)
        rule = None if root.kind == "file" else _left_out_by(relative, hidden, options)
        if rule is not None:
            skipped.setdefault(rule, []).append(relative)
            continue
        files.append(SourceFile(relative, url, fingerprint(info)))
    first = sorted(path for paths in skipped.values() for path in paths)[:LEFT_OUT_SHOWN]
    left_out = LeftOut({rule: len(paths) for rule, paths in skipped.items()}, tuple(first))
    if not files:
        said = f"; {left_out.describe()}" if left_out.total else ""
        raise CorpusMismatch(f"no file matches this corpus path{said}; check corpus.path", file=options.path)
    files.sort(key=lambda f: f.path)
    return Listing(root, files, left_out)


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
    """``(".",)``: a name starting with ``.`` is hidden, unless a glob itself starts a component with it
    (``data/.cache/*.jsonl``); then nothing is."""
    tail = root.pattern[len(root.root):].lstrip("/").split("/") if root.kind == "glob" else []
    return () if any(part.startswith(".") for part in tail) else (".",)


def _left_out_by(relative: str, hidden: tuple[str, ...], options: CorpusOptions) -> str | None:
    """The rule that leaves ``relative`` out of the corpus, or ``None`` when it is read."""
    if _is_excluded(relative, options.exclude):
        return "output"
    parts = relative.split("/")
    if hidden and any(part.startswith(hidden) for part in parts):
        return "hidden"
    if parts[-1] in MARKER_FILES:
        return "marker"
    paths = ["/".join(parts[:end]) for end in range(1, len(parts) + 1)]  # its folders, then itself
    if any(fnmatch.fnmatchcase(path, pattern) for pattern in options.exclude_globs for path in paths):
        return "excluded"
    return None


def _is_excluded(relative: str, exclude: tuple[str, ...]) -> bool:
    return any(relative == folder or relative.startswith(folder + "/") for folder in exclude)
