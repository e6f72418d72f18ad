"""Where the job's output lies relative to its corpus: apart, inside it (left out), or refused.

An output written inside the corpus folder (``corpus.path: data``, ``output.path: data/out``)
would be listed by the next run as corpus: its vectors parts and run reports read back as
documents. Such an output is left out of the corpus listing (``CorpusOptions.exclude``) — a local
folder and an object-store prefix alike, and under a glob's folder (``data/**``) too. An output
that *is* the corpus folder, or one that holds the corpus, cannot be told apart from it and is
refused before any work.

Nothing is listed or opened here: both paths are resolved by fsspec (local paths made absolute,
symbolic links followed) and compared as paths. Two object-store paths are taken to be on the same
store unless their storage options name different endpoints.
"""

from __future__ import annotations

import os
import posixpath
from collections.abc import Mapping
from typing import Any

import fsspec

from teibatch.corpus.builtin import is_builtin
from teibatch.corpus.listing import glob_root, has_glob
from teibatch.corpus.records import CorpusOptions
from teibatch.errors import JobSpecError

_LOCAL_PROTOCOLS = frozenset({"file", "local"})


def output_inside(corpus: CorpusOptions, output_path: str, output_storage: Mapping[str, Any]) -> str | None:
    """The output's folder relative to the corpus root when it lies inside the corpus, else ``None``.

    Raises :class:`JobSpecError` (key ``output.path``, naming both paths) when the output is the
    corpus root itself or the corpus lies inside the output. Paths fsspec cannot resolve (an
    extra not installed) are ``None``: listing or writing reports them with the path.
    """
    if is_builtin(corpus.path):
        return None
    where = _resolve(corpus.path, corpus.storage_options)
    there = _resolve(output_path, output_storage)
    if where is None or there is None or not _same_store(where, there, corpus.storage_options, output_storage):
        return None
    root, output = where[1], there[1]
    if not root or not output:
        return None
    if output == root:
        raise JobSpecError(f"{output_path} is the corpus's own folder (corpus.path: {corpus.path}), so a run "
                           "would read its vectors and reports back as documents: choose an output.path outside "
                           "the corpus, or a folder inside it (left out of the corpus)", key="output.path")
    if root.startswith(output + "/"):
        raise JobSpecError(f"the corpus ({corpus.path}) lies inside the output ({output_path}), so a run would "
                           "read what it writes: choose an output.path that does not hold the corpus",
                           key="output.path")
    if output.startswith(root + "/"):
        return output[len(root) + 1:]
    return None


def exclusion_note(options: CorpusOptions) -> str | None:
    """One line for ``validate`` and ``run`` saying which folders the corpus listing leaves out."""
    if not options.exclude:
        return None
    folders = ", ".join(f"{folder}/" for folder in options.exclude)
    return f"corpus: the output ({folders}) lies inside {options.path} and is left out of the corpus"


def _resolve(path: str, storage: Mapping[str, Any]) -> tuple[frozenset[str], str] | None:
    """The protocols of ``path``'s filesystem and the folder it names (a glob's folder before its wildcard)."""
    try:
        fs, native = fsspec.core.url_to_fs(path, **storage)
    except (ImportError, ValueError):
        return None
    protocols = frozenset([fs.protocol] if isinstance(fs.protocol, str) else fs.protocol)
    folder = glob_root(native) if has_glob(native) else native
    folder = folder.rstrip("/")
    if protocols & _LOCAL_PROTOCOLS:
        folder = os.path.realpath(folder or "/")
    return protocols, posixpath.normpath(folder) if folder else ""


def _same_store(where: tuple[frozenset[str], str], there: tuple[frozenset[str], str],
                corpus_storage: Mapping[str, Any], output_storage: Mapping[str, Any]) -> bool:
    if not where[0] & there[0]:
        return False
    endpoints = {_endpoint(corpus_storage), _endpoint(output_storage)} - {None}
    return len(endpoints) <= 1


def _endpoint(storage: Mapping[str, Any]) -> str | None:
    client = storage.get("client_kwargs")
    endpoint = (client.get("endpoint_url") if isinstance(client, Mapping) else None) or storage.get("endpoint_url")
    return str(endpoint).rstrip("/") if endpoint else None
