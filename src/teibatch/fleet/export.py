"""Volumes off a host and back: a tar stream over the host's shell (SSH), to and from any fsspec URL.

An export of a volume is a folder::

    <to>/<instance>/data/...         the volume's files, as they are on the host
    <to>/<instance>/_export.json     sha256 and size of every file, symlinks, where it came from

It counts as done only when every file read back from the destination has the sha256 that
``sha256sum`` computed on the host, and ``_export.json`` is written last, so a folder without it is
an export that did not finish. An import (``export.import_from``) streams such a folder into a new
host's volume and checks the host's ``sha256sum`` against the manifest, so TEI finds the weights
and downloads nothing.
"""

from __future__ import annotations

import hashlib
import posixpath
import shlex
import shutil
import tarfile
import time
from collections.abc import Mapping
from datetime import datetime, timezone
from typing import Any

import fsspec
import orjson

from teibatch.errors import ExportFailed, FleetError
from teibatch.fleet.shell import Shell

MANIFEST = "_export.json"
DATA = "data"
CHUNK = 1 << 20


def remote_checksums(shell: Shell, volume: str, *, timeout: float) -> dict[str, str]:
    """``sha256sum`` of every regular file under ``volume`` on the host: relative path → hex digest."""
    command = f"cd {shlex.quote(volume)} && find . -type f -print0 | xargs -0 -r sha256sum"
    result = shell.run(command, what="sha256sum (volume)", timeout=timeout)
    sums = {}
    for line in result.text.splitlines():
        escaped = line.startswith("\\")  # sha256sum escapes names holding a newline or a backslash
        digest, _, name = line.lstrip("\\").partition("  ")
        if escaped:
            name = name.replace("\\n", "\n").replace("\\\\", "\\")
        sums[_relative(name)] = digest
    return sums


def _relative(name: str) -> str:
    """A member path relative to the volume; anything escaping it is refused."""
    path = posixpath.normpath(name)
    if posixpath.isabs(path) or path == ".." or path.startswith("../"):
        raise FleetError(f"refusing the path {name!r}: it leaves the volume")
    return path


def _digest(fs: Any, path: str) -> str:
    sha = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(CHUNK):
            sha.update(chunk)
    return sha.hexdigest()


def export_volume(shell: Shell, volume: str, url: str, *, timeout: float,
                  storage_options: Mapping[str, Any] | None = None, about: Mapping[str, str] | None = None) -> str:
    """Copy ``volume`` on the host to ``url`` and verify it; return ``url``. Raises :class:`ExportFailed`."""
    deadline = time.monotonic() + timeout
    try:
        expected = remote_checksums(shell, volume, timeout=timeout)
        fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
        root = root.rstrip("/")
        fs.makedirs(f"{root}/{DATA}", exist_ok=True)
        sizes: dict[str, int] = {}
        links: dict[str, str] = {}
        remaining = max(1.0, deadline - time.monotonic())
        with shell.stream(f"tar -C {shlex.quote(volume)} -cf - .", what="tar (export)", timeout=remaining) as pipe, \
                tarfile.open(fileobj=pipe, mode="r|") as tar:
            for member in tar:
                if member.isdir():
                    continue
                rel = _relative(member.name)
                if member.issym():
                    links[rel] = member.linkname
                    continue
                if not member.isfile():
                    continue  # hard links, devices, fifos: not model data
                target = f"{root}/{DATA}/{rel}"
                fs.makedirs(posixpath.dirname(target), exist_ok=True)
                source = tar.extractfile(member)
                assert source is not None
                with fs.open(target, "wb") as out:
                    shutil.copyfileobj(source, out, CHUNK)
                sizes[rel] = member.size
            # tarfile stops at the end-of-archive marker, but tar pads its output to a whole record:
            # read it to the end, or tar dies of SIGPIPE (exit 141) when the pipe closes under it.
            while pipe.read(CHUNK):
                pass
        problems = []
        if set(sizes) != set(expected):
            problems.append(f"the copy has {len(sizes)} files, the volume {len(expected)}")
        for rel, digest in expected.items():
            if rel in sizes and _digest(fs, f"{root}/{DATA}/{rel}") != digest:
                problems.append(f"{rel}: sha256 differs from the host's")
        if problems:
            raise ExportFailed(f"{shell.label}: the copy of {volume} at {url} did not verify: "
                               + "; ".join(problems[:5]))
        manifest = {"source": {"host": shell.label, "volume": volume, **dict(about or {})},
                    "verified_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "files": {rel: {"sha256": expected[rel], "size": sizes[rel]} for rel in sorted(expected)},
                    "links": dict(sorted(links.items()))}
        with fs.open(f"{root}/{MANIFEST}", "wb") as out:
            out.write(orjson.dumps(manifest, option=orjson.OPT_INDENT_2))
        return url
    except ExportFailed:
        raise
    except Exception as exc:  # fsspec backends raise their own errors: all mean "not exported"
        raise ExportFailed(f"{shell.label}: could not export {volume} to {url}: {exc}") from exc


def read_manifest(url: str, storage_options: Mapping[str, Any] | None = None) -> tuple[Any, str, dict[str, Any]]:
    """The filesystem, root and manifest of an export at ``url`` (or of the first one inside it)."""
    fs, root = fsspec.core.url_to_fs(url, **dict(storage_options or {}))
    root = root.rstrip("/")
    if not fs.exists(f"{root}/{MANIFEST}"):
        inner = sorted(fs.glob(f"{root}/*/{MANIFEST}"))
        if not inner:
            raise FleetError(f"{url} holds no export ({MANIFEST} not found there or one folder below)")
        root = posixpath.dirname(inner[0])
    with fs.open(f"{root}/{MANIFEST}", "rb") as handle:
        return fs, root, dict(orjson.loads(handle.read()))


def seed_volume(shell: Shell, url: str, volume: str, *, timeout: float,
                storage_options: Mapping[str, Any] | None = None) -> int:
    """Fill ``volume`` on the host from the export at ``url``; return the number of files verified.

    Raises :class:`FleetError` when the export cannot be read whole (no manifest, a file missing from
    ``data/``), the host's ``tar`` fails, or a file on the host does not match the manifest's sha256.
    """
    deadline = time.monotonic() + timeout
    quoted = shlex.quote(volume)
    try:
        fs, root, manifest = read_manifest(url, storage_options)
        files: dict[str, Any] = manifest.get("files", {})
        # Every file looked up before the host's tar starts: a file missing half way would end the stream,
        # and the broken pipe would hide which file it was.
        missing = [rel for rel in files if not fs.exists(f"{root}/{DATA}/{rel}")]
        if missing:
            raise FleetError(f"{shell.label}: could not import {url} into {volume}: {len(missing)} file(s) of its "
                             f"manifest are missing from {DATA}/: {', '.join(missing[:5])}")
        with shell.stream(f"mkdir -p {quoted} && tar -C {quoted} -xf -", what="tar (import)", timeout=timeout,
                          stdin=True) as pipe, tarfile.open(fileobj=pipe, mode="w|") as tar:
            for rel, info in files.items():
                member = tarfile.TarInfo(_relative(rel))
                member.size = int(info["size"])
                with fs.open(f"{root}/{DATA}/{rel}", "rb") as source:
                    tar.addfile(member, source)
            for rel, target in manifest.get("links", {}).items():
                member = tarfile.TarInfo(_relative(rel))
                member.type, member.linkname = tarfile.SYMTYPE, target
                tar.addfile(member)
    except FleetError:
        raise
    except Exception as exc:  # fsspec backends and a torn manifest raise their own errors: all mean "not imported"
        raise FleetError(f"{shell.label}: could not import {url} into {volume}: {exc}") from exc
    present = remote_checksums(shell, volume, timeout=max(1.0, deadline - time.monotonic()))
    wrong = [rel for rel, info in files.items() if present.get(_relative(rel)) != info["sha256"]]
    if wrong:
        raise FleetError(f"{shell.label}: the imported files do not match {url}'s manifest: {', '.join(wrong[:5])}")
    return len(files)
