"""Provider ``local``: built-in TEI-compatible servers started as processes on this machine."""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, JobSpecError
from teibatch.fleet.base import HEALTH_POLL_S, Capability, LaunchSpec, Provider, wait_healthy
from teibatch.fleet.shell import die_with_parent
from teibatch.server.backends import can_serve, servable_models

log = logging.getLogger(__name__)

STOP_GRACE_S = 5.0
WORKDIR_PREFIX = "teibatch-local-"
BACKEND_FLAG = "--backend"
DEFAULT_BACKEND = "hashing"


def server_flag(server_args: tuple[str, ...] | list[str], flag: str) -> str | None:
    """The value of ``flag`` among a local server's flags (``--backend numpy`` or ``--backend=numpy``)."""
    for index, arg in enumerate(server_args):
        if arg == flag and index + 1 < len(server_args):
            return server_args[index + 1]
        if arg.startswith(flag + "="):
            return arg.partition("=")[2]
    return None


def check_model(model_id: str | None, server_args: tuple[str, ...] | list[str]) -> None:
    """Refuse a ``model.id`` the built-in server cannot compute with the backend ``server_args`` name.

    Started with ``--model-id`` of a model its backend does not run, the server would report that
    name in ``/info`` (and the output's metadata would carry it) over vectors of another model.
    """
    backend = server_flag(server_args, BACKEND_FLAG) or DEFAULT_BACKEND
    if can_serve(backend, model_id):
        return
    raise JobSpecError(
        f"{model_id!r} is not a model the built-in servers can run with --backend {backend}; they would "
        f"answer with other vectors under its name. They serve: {servable_models()} (set servers.server_args). "
        f"To embed with {model_id} use real TEI: servers.engine: docker (TEI's CPU image, with a Docker engine), "
        "servers.provider: static with servers.urls of TEI servers already running, ssh, or a GPU cloud",
        key="model.id")


def remove_orphan_workdirs(root: Path | None = None) -> list[Path]:
    """Delete the servers' folders (ready files, logs) of runs whose driver is gone; return them.

    A driver killed with SIGKILL cannot clean up after itself; the next run on the machine does.
    Only folders whose name carries a pid that no longer runs are touched.
    """
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(f"{WORKDIR_PREFIX}*-*"):
        pid = folder.name.removeprefix(WORKDIR_PREFIX).partition("-")[0]
        if not pid.isdigit() or _pid_alive(int(pid)) or not folder.is_dir():
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean
        return True
    return True


@dataclass
class _Process:
    popen: subprocess.Popen[bytes]
    ready_file: Path
    log_file: Path
    url: str | None = None


class LocalProvider(Provider):
    """Starts ``count`` servers with ``python -m teibatch serve`` on free 127.0.0.1 ports.

    Each run gets a fresh random API key, passed through the environment (never the command
    line, which other users can read). Servers stop when the run ends, whatever happens, and die
    with the driver process if it is killed.
    """

    name = "local"
    capabilities = frozenset({Capability.LAUNCH})

    def __init__(self, count: int, *, model_id: str | None = None, server_args: list[str] | None = None,
                 startup_timeout: float = 60.0, payload_limit: int | None = None) -> None:
        self.count = count
        self.model_id = model_id
        self.server_args = list(server_args or [])
        self.startup_timeout = startup_timeout
        self.payload_limit = payload_limit
        self.api_key = secrets.token_urlsafe(24)
        self._workdir: tempfile.TemporaryDirectory[str] | None = None
        self._processes: list[_Process] = []

    def command(self, ready_file: Path) -> list[str]:
        """The command line of one server."""
        command = [sys.executable, "-m", "teibatch", "serve", "--hostname", "127.0.0.1", "--port", "0",
                   "--ready-file", str(ready_file)]
        if self.model_id:
            command += ["--model-id", self.model_id]
        return command + self.server_args

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        if self._processes:  # idempotent: this run's servers already run
            return [Endpoint(p.url, self.api_key, self.payload_limit) for p in self._processes if p.url]
        remove_orphan_workdirs()
        # The pid in the name lets a later run remove this folder if this driver is killed outright.
        self._workdir = tempfile.TemporaryDirectory(prefix=f"{WORKDIR_PREFIX}{os.getpid()}-")
        workdir = Path(self._workdir.name)
        env = {**os.environ, "API_KEY": self.api_key}
        for index in range(self.count):
            ready, log_path = workdir / f"server-{index}.json", workdir / f"server-{index}.log"
            with open(log_path, "wb") as log_handle:
                popen = subprocess.Popen(self.command(ready), stdin=subprocess.DEVNULL, stdout=log_handle,
                                         stderr=subprocess.STDOUT, env=env,
                                         preexec_fn=die_with_parent if sys.platform == "linux" else None)
            self._processes.append(_Process(popen, ready, log_path))
        deadline = time.monotonic() + self.startup_timeout
        for process in self._processes:
            self._wait_ready(process, deadline)
        return [Endpoint(p.url, self.api_key, self.payload_limit) for p in self._processes if p.url]

    def _wait_ready(self, process: _Process, deadline: float) -> None:
        while time.monotonic() < deadline and process.popen.poll() is None and not process.ready_file.exists():
            time.sleep(HEALTH_POLL_S / 2)
        if process.ready_file.exists():
            url = orjson.loads(process.ready_file.read_bytes())["url"]
            if wait_healthy(url, deadline, alive=lambda: process.popen.poll() is None):
                process.url = url
                return
        raise CapacityUnavailable(
            f"a local TEI server did not become healthy within {self.startup_timeout:.0f}s "
            f"(exit code {process.popen.poll()}); its log ends with:\n{self._log_tail(process)}")

    @staticmethod
    def _log_tail(process: _Process, lines: int = 15) -> str:
        try:
            text = process.log_file.read_text(errors="replace")
        except OSError:
            return "(no log)"
        return "\n".join(text.splitlines()[-lines:]) or "(empty log)"

    def down(self) -> None:
        for process in self._processes:
            if process.popen.poll() is None:
                process.popen.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        for process in self._processes:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("local server pid %d ignored SIGTERM; killing it", process.popen.pid)
                process.popen.kill()
                process.popen.wait()
        self._processes.clear()
        if self._workdir is not None:
            self._workdir.cleanup()
            self._workdir = None
