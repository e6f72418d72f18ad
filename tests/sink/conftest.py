"""Fixtures for the output's files: a disk that fills up."""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any

import pytest

from teibatch.sink import OutputStore


class _Filling:
    """A file opened for writing on a disk with ``room`` bytes left (shared by every file of the disk)."""

    def __init__(self, handle: Any, disk: FullDisk) -> None:
        self._handle, self._disk = handle, disk

    def write(self, data: bytes) -> int:
        fits = max(0, min(len(data), self._disk.room))
        self._handle.write(bytes(data[:fits]))
        self._disk.room -= fits
        if fits < len(data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return fits

    def __enter__(self) -> _Filling:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._handle.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._handle, name)


class FullDisk:
    """What ``store``'s files opened for writing may still take in all, in bytes; then ``ENOSPC``."""

    def __init__(self, store: OutputStore, room: int, monkeypatch: pytest.MonkeyPatch) -> None:
        self.room = room
        real_open = store.fs.open

        def open_(path: str, mode: str = "rb", **kwargs: Any) -> Any:
            handle = real_open(path, mode, **kwargs)
            return handle if "r" in mode else _Filling(handle, self)

        monkeypatch.setattr(store.fs, "open", open_)


@pytest.fixture
def full_disk(monkeypatch: pytest.MonkeyPatch) -> Callable[[OutputStore, int], FullDisk]:
    """``full_disk(store, room)``: from now until the test ends, ``store`` has ``room`` bytes left."""
    return lambda store, room: FullDisk(store, room, monkeypatch)
