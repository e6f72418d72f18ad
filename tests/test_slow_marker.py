"""`pytest -m "not slow"` leaves out the tests that start Ray, server or driver processes, an sshd or a fake cloud."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def collected(*args: str) -> set[str]:
    done = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
                          cwd=REPO, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stdout + done.stderr
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_the_quick_loop_leaves_out_what_starts_processes() -> None:
    files = ["tests/pipeline/test_run.py",  # Ray, through the ray_session fixture
             "tests/pipeline/test_interrupt.py",  # drivers in processes of their own, marked by hand
             "tests/test_imports.py"]  # reads source files only
    everything = collected(*files)
    quick = collected("-m", "not slow", *files)
    assert {test.split("::")[0] for test in everything} == set(files)
    assert quick == {test for test in everything if test.startswith("tests/test_imports.py::")}
