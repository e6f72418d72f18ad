"""A driver killed outright leaves its local servers' folder behind; the next run removes it."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from teibatch.fleet.providers.local import WORKDIR_PREFIX, remove_orphan_workdirs


def dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_only_folders_of_dead_drivers_are_removed(tmp_path: Path) -> None:
    orphan = tmp_path / f"{WORKDIR_PREFIX}{dead_pid()}-abc123"
    live = tmp_path / f"{WORKDIR_PREFIX}{os.getpid()}-def456"
    unrelated = tmp_path / f"{WORKDIR_PREFIX}notapid-xyz"
    for folder in (orphan, live, unrelated):
        folder.mkdir()
        (folder / "server-0.log").write_text("log")
    assert remove_orphan_workdirs(tmp_path) == [orphan]
    assert not orphan.exists() and live.exists() and unrelated.exists()
