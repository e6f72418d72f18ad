"""Which Ray a run uses: a private one of its own, or a cluster it was told to join — never one it stumbled on.

Without ``--ray-address`` (or ``RAY_ADDRESS``), ``ray.init()`` would join any cluster that
``ray start`` left running on the machine, whoever started it and whatever its Ray version. A run
starts its own local Ray instead (``address="local"``). Ray protects a new local cluster with token
authentication unless ``RAY_AUTH_MODE`` says otherwise (its token lives in ``~/.ray/auth_token``),
so nothing else on the network can use it; its notice about that, and Ray's other start-up notices,
do not reach the user's terminal. ``--ray-address auto`` joins the local cluster on
purpose; ``ray job submit`` sets ``RAY_ADDRESS`` for its entrypoint, which is then joined.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager

import ray

from teibatch.errors import RayUnavailable

REACH_TIMEOUT_S = 5.0


@contextmanager
def ray_session(address: str | None, timings: dict[str, float] | None = None) -> Iterator[None]:
    """Ray for the length of the block: the one already initialised, ``address``, or a private local one.

    ``ray.init`` installs its own SIGTERM handler: callers that handle SIGTERM take it back after entering.
    """
    if ray.is_initialized():
        yield
        return
    started = time.monotonic()
    _init(address)
    if timings is not None:
        timings["ray_start_s"] = time.monotonic() - started
    try:
        yield
    finally:
        ray.shutdown()


def _init(address: str | None) -> None:
    target = "local" if address is None else address
    if address is not None:
        _check_reachable(address)
    quiet = [logging.getLogger(name) for name in ("ray", "ray._private.authentication.authentication_token_setup")]
    levels = [logger.level for logger in quiet]
    for logger in quiet:
        logger.setLevel(logging.ERROR)
    try:
        ray.init(address=target, include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING,
                 configure_logging=False)
    except Exception as exc:  # ray raises RuntimeError, ConnectionError, ValueError... for the same thing
        raise RayUnavailable(_explain(address, exc)) from exc
    finally:
        for logger, level in zip(quiet, levels, strict=True):
            logger.setLevel(level)


def _check_reachable(address: str, timeout: float = REACH_TIMEOUT_S) -> None:
    """Fail in seconds on an address where nothing listens (``ray.init`` itself waits minutes)."""
    host, _, port = address.removeprefix("ray://").rpartition(":")
    if not host or not port.isdigit():
        return  # "auto", or a form Ray resolves itself
    try:
        socket.create_connection((host, int(port)), timeout=timeout).close()
    except OSError as exc:
        raise RayUnavailable(_explain(address, exc)) from exc


def _explain(address: str | None, exc: Exception) -> str:
    first = next((line.strip() for line in str(exc).splitlines() if line.strip()), type(exc).__name__)
    if address is None:
        return f"could not start a local Ray for this run: {first}"
    return (f"could not join the Ray cluster at {address!r} (from --ray-address or RAY_ADDRESS): {first}; "
            "check the address and that the cluster runs the same Ray version as this teibatch, or leave "
            "--ray-address out to run on a private local Ray")

