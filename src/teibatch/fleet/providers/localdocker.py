"""Provider ``local`` with a Docker engine: the real TEI CPU image on this machine.

The same launch / export / destroy logic as ``ssh`` (:class:`~teibatch.fleet.hosted.ContainerProvider`)
through a local shell: the CPU image for this machine's platform from ``configs/images.yaml``, bound
to 127.0.0.1, reached directly. Chosen by ``servers.engine: docker`` (or ``auto`` when an engine answers).
"""

from __future__ import annotations

import subprocess
from typing import Any

from teibatch.fleet.hosted import ContainerProvider, HostPlan
from teibatch.fleet.ledger import state_dir
from teibatch.fleet.shell import LocalShell

ENGINE_PROBE_TIMEOUT_S = 5.0


def docker_engine_available(timeout: float = ENGINE_PROBE_TIMEOUT_S) -> bool:
    """Whether ``docker info`` reaches an engine (a client alone is not enough)."""
    try:
        done = subprocess.run(["docker", "info", "--format", "{{.ServerVersion}}"], capture_output=True,
                              timeout=timeout, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0 and bool(done.stdout.strip())


class LocalDockerProvider(ContainerProvider):
    """``count`` TEI CPU containers on this machine, sharing one volume (``<state dir>/volumes/tei``)."""

    def __init__(self, count: int, **options: Any) -> None:
        options.setdefault("volume", str(state_dir() / "volumes" / "tei"))
        super().__init__([HostPlan(LocalShell()) for _ in range(count)], name="local", gpu=False, **options)
