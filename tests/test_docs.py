"""The docs that are generated stay in step with the code."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def test_generated_reference_pages_are_current() -> None:
    # In a fresh process: click caches each command's help option on first use, so a command
    # invoked alone by an earlier test would print differently here.
    check = subprocess.run([sys.executable, str(REPO / "scripts" / "reference_docs.py"), "--check"],
                           capture_output=True, text=True, check=False)
    assert check.returncode == 0, check.stderr


def test_init_only_reexports_sorted() -> None:
    import teibatch

    assert teibatch.__all__ == sorted(teibatch.__all__)
