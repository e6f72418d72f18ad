"""The output location on any fsspec filesystem, with all-or-nothing writes."""

from __future__ import annotations

import contextlib
import errno
import uuid
from collections.abc import Callable, Sequence
from typing import IO, Any

import fsspec
import orjson
from fsspec.implementations.local import LocalFileSystem

from teibatch.errors import OutputUnwritable, SinkError, StorageFull
from teibatch.storage_errors import STORAGE_ERRORS, storage_full

TEMP_MARK = ".tmp-"
REPLACED_WHILE_READ_ATTEMPTS = 5
"""Reads of a small JSON file that another writer keeps replacing, before the error is the caller's."""


class OutputStore:
    """Files under one output root (local path or URL such as ``s3://bucket/prefix``).

    :meth:`write_atomic` makes a file visible only whole: on a local disk it writes a hidden
    temporary file and renames it; on object stores the upload completes only when the write did
    (one PUT, or a multipart upload's completion), and a failed write is dropped (:func:`_abandon`).
    A write refused for want of room raises :class:`StorageFull`, any other :class:`SinkError`.
    """

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        try:
            self.fs, path = fsspec.core.url_to_fs(root, **(storage_options or {}))
        except (ImportError, ValueError) as exc:
            raise SinkError(f"cannot open output {root!r}: {exc}") from exc
        self.root = path.rstrip("/")
        self.url = root

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, LocalFileSystem)

    def path(self, relative: str) -> str:
        return f"{self.root}/{relative}"

    def write_atomic(self, relative: str, write: Callable[[IO[bytes]], object]) -> None:
        """Call ``write`` with a binary file object; the result appears at ``relative`` only when complete."""
        final = self.path(relative)
        directory, _, name = final.rpartition("/")
        try:
            self.fs.makedirs(directory, exist_ok=True)
            if not self.is_local:
                handle = self.fs.open(final, "wb")
                try:
                    write(handle)
                except BaseException:
                    _abandon(handle)
                    raise
                handle.close()  # the upload: one PUT, or the multipart upload's completion
                return
            temp = f"{directory}/{TEMP_MARK}{uuid.uuid4().hex[:12]}-{name}"
            try:
                with self.fs.open(temp, "wb") as handle:
                    write(handle)
                self.fs.mv(temp, final)
            finally:
                if self.fs.exists(temp):
                    self.fs.rm(temp)
        except STORAGE_ERRORS as exc:
            raise self._write_error(relative, exc) from exc

    def _write_error(self, relative: str, exc: BaseException) -> SinkError:
        """What a failed write of ``relative`` raises: :class:`StorageFull` when there is no room left."""
        if storage_full(exc):
            return StorageFull(f"no room left to write {self.url}/{relative}: {exc}", path=self.url)
        return SinkError(f"cannot write {self.url}/{relative}: {exc}")

    def write_json(self, relative: str, data: Any) -> None:
        blob = orjson.dumps(data, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS)
        self.write_atomic(relative, lambda handle: handle.write(blob))

    def read_json(self, relative: str, *, fresh: bool = False) -> Any | None:
        """The JSON at ``relative``, or ``None`` when there is no such file.

        ``fresh``: another process may have just written it; forget what the filesystem cached about it.
        """
        final = self.path(relative)
        if fresh:
            self.fs.invalidate_cache(final)
        for attempt in range(1, REPLACED_WHILE_READ_ATTEMPTS + 1):
            try:
                with self.fs.open(final, "rb") as handle:
                    blob = handle.read()
                break
            except FileNotFoundError:
                return None
            except OSError as exc:
                # s3fs reads an object by its ETag: one replaced between its opening and its reading
                # (a lock's heartbeat rewriting it) fails with EBUSY. Read the new one.
                if exc.errno == errno.EBUSY and attempt < REPLACED_WHILE_READ_ATTEMPTS:
                    self.fs.invalidate_cache(final)
                    continue
                raise SinkError(f"cannot read {self.url}/{relative}: {exc}") from exc
        try:
            return orjson.loads(blob)
        except orjson.JSONDecodeError as exc:
            raise SinkError(f"{self.url}/{relative} is not valid JSON ({exc}); "
                            "restore it or start a new output path") from exc

    def create_exclusive(self, relative: str, data: bytes) -> None:
        """Write ``data`` at ``relative`` only if nothing is there; raise ``FileExistsError`` otherwise.

        Local disks create with ``O_EXCL``; object stores send ``If-None-Match: *`` (AWS S3 and
        compatible stores that honour it, moto's server included). A local file created but not
        written whole (a full disk) is removed: nobody could read it, and it would stand in the way.
        """
        final = self.path(relative)
        created = False
        try:
            self.fs.makedirs(final.rpartition("/")[0], exist_ok=True)
            with self.fs.open(final, "xb") as handle:
                created = True
                handle.write(data)
        except FileExistsError:
            raise
        except STORAGE_ERRORS as exc:
            if created and self.is_local:  # an object store's failed PUT left nothing
                self.remove(relative)
            raise self._write_error(relative, exc) from exc

    def list(self, relative_dir: str) -> list[str]:
        """Names of the files directly in ``relative_dir`` (empty when it does not exist)."""
        return sorted(str(entry).rstrip("/").rpartition("/")[2] for entry in self._ls(relative_dir, detail=False))

    def check_writable(self) -> None:
        """Write and remove a small probe file: an output that cannot be written is found before any work."""
        probe = f"{TEMP_MARK}probe-{uuid.uuid4().hex[:12]}"
        try:
            self.fs.makedirs(self.root, exist_ok=True)
            with self.fs.open(self.path(probe), "wb") as handle:
                handle.write(b"teibatch write probe\n")
            self.fs.rm(self.path(probe))
        except STORAGE_ERRORS as exc:
            if storage_full(exc):
                with contextlib.suppress(*STORAGE_ERRORS):
                    self.remove(probe)  # created, but not written on a full disk
                raise self._write_error(probe, exc) from exc
            raise OutputUnwritable(f"cannot write to the output {self.url}: {exc}; check output.path and its "
                            "permissions (or credentials) before running again") from exc

    def move(self, relative: str, to: str) -> None:
        """Rename ``relative`` to ``to``: one rename on a local disk; a copy, then a delete, on an object store
        (where ``to`` appears whole, as a copy is one request)."""
        try:
            self.fs.mv(self.path(relative), self.path(to))
        except FileNotFoundError:
            raise
        except STORAGE_ERRORS as exc:
            raise self._write_error(to, exc) from exc

    def remove(self, relative: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.fs.rm(self.path(relative))

    def sizes(self, relative_dir: str) -> dict[str, int]:
        """Bytes of each file directly in ``relative_dir``, by name (empty when it does not exist)."""
        return {str(entry["name"]).rstrip("/").rpartition("/")[2]: int(entry.get("size") or 0)
                for entry in self._ls(relative_dir, detail=True) if entry.get("type") == "file"}

    def _ls(self, relative_dir: str, *, detail: bool) -> Sequence[Any]:
        """The entries directly in ``relative_dir`` (``fs.ls``), none when it does not exist."""
        # Other processes (shard tasks) write here: never answer from a cached listing.
        self.fs.invalidate_cache()
        try:
            return self.fs.ls(self.path(relative_dir), detail=detail)
        except FileNotFoundError:
            return []


def _abandon(handle: Any) -> None:
    """Drop a half-written object-store file so that none of it appears.

    fsspec's file objects upload whatever was written when they are closed, by ``with`` or by the
    garbage collector, even after an error: a part cut short would appear whole-looking at its
    final name. ``discard`` aborts a multipart upload; marking the file closed stops the rest.
    """
    discard = getattr(handle, "discard", None)
    if callable(discard):
        with contextlib.suppress(Exception):
            discard()
    with contextlib.suppress(AttributeError):
        handle.closed = True
