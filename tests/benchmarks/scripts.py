"""Running a script of ``benchmarks/`` as a user would, for the tests that check what it prints."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


def run_benchmark(script: str, *args: str, timeout: float = 300, env: dict[str, str] | None = None) -> str:
    """What ``benchmarks/<script>`` printed with ``args``, after checking that it exited 0; ``env``:
    variables set on top of this process's (whose import path the script gets)."""
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})}
    done = subprocess.run([sys.executable, str(BENCHMARKS / script), *args], capture_output=True, text=True,
                          timeout=timeout, env=environment, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout
