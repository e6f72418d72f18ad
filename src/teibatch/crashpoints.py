"""Named points where a test can make teibatch die by SIGKILL, to prove that every crash is safe.

``TEIBATCH_CRASH_AT=<point>:<n>`` kills the process (SIGKILL, no cleanup) the n-th time it reaches
``<point>``; with ``TEIBATCH_CRASH_ONCE=<file>`` it does so only if that file does not exist yet,
creating it first, so a retried Ray task or a resumed run gets past the point. Points:

* ``plan`` — the driver, after planning and before any shard runs;
* ``commit`` — the driver, right after the n-th shard was recorded in the manifest;
* ``manifest-write`` — the driver, half-way through writing the manifest's temporary file;
* ``shard-write`` — a shard task, between writing its rejects part and its vectors part;
* ``replace`` — the driver, after deleting the parts a committed group supersedes and before renaming
  its staged parts into place (``sink/replace.py``).

Unset, as in every normal run, a check costs one environment lookup.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path

CRASH_AT = "TEIBATCH_CRASH_AT"
CRASH_ONCE = "TEIBATCH_CRASH_ONCE"

_reached: Counter[str] = Counter()


def crashpoint(point: str) -> None:
    """Die here if the environment asks for it (see the module docstring)."""
    spec = os.environ.get(CRASH_AT)
    if not spec:
        return
    name, _, count = spec.partition(":")
    if name != point:
        return
    _reached[point] += 1
    if _reached[point] != int(count or 1):
        return
    once = os.environ.get(CRASH_ONCE)
    if once:
        marker = Path(once)
        if marker.exists():
            return
        marker.touch()
    os.kill(os.getpid(), signal.SIGKILL)


def task_environment() -> dict[str, str]:
    """The crash settings to hand to worker processes (which do not inherit the driver's environment)."""
    return {name: os.environ[name] for name in (CRASH_AT, CRASH_ONCE) if name in os.environ}
