"""The ledger: what each run launched, written *before* each launch and after each step.

One JSON file per run under ``<state dir>/ledger/<run id>.json`` (state dir: ``$TEIBATCH_STATE_DIR``,
else ``$XDG_STATE_HOME/teibatch``, else ``~/.local/state/teibatch``), replaced atomically on every
update. A run killed with SIGKILL leaves its file behind with instances not ``destroyed``;
``teibatch fleet sweep`` reads it, reaches the hosts again and destroys what is left.

The ledger never holds a secret: hosts are addresses, key files are paths, API keys are not written.
"""

from __future__ import annotations

import contextlib
import os
import socket
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import orjson

from teibatch.errors import FleetError
from teibatch.fleet.base import InstanceState

STATE_DIR_ENV = "TEIBATCH_STATE_DIR"


def state_dir() -> Path:
    """teibatch's state directory (the ledger lives in its ``ledger/`` folder)."""
    if os.environ.get(STATE_DIR_ENV):
        return Path(os.environ[STATE_DIR_ENV])
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "teibatch"


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _process_start(pid: int) -> str | None:
    """The start time of process ``pid`` in clock ticks since boot (tells a pid reused from a dead one)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def driver_record() -> dict[str, Any]:
    pid = os.getpid()
    return {"hostname": socket.gethostname(), "pid": pid, "start": _process_start(pid)}


def driver_alive(driver: dict[str, Any]) -> bool:
    """Whether the process that wrote a run still runs it (only knowable on the same machine)."""
    if driver.get("released") or driver.get("hostname") != socket.gethostname():
        return False
    start = _process_start(int(driver.get("pid", -1)))
    return start is not None and start == driver.get("start")


@dataclass(frozen=True)
class LedgerEntry:
    """One instance as the ledger last recorded it."""

    run_id: str
    provider: str
    instance: str
    host: str | None
    state: InstanceState
    updated: str
    driver_alive: bool
    export: str | None = None
    error: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {**asdict(self), "state": self.state.value}


class Ledger:
    """The run files in one directory; safe to use from several threads of one driver."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else state_dir() / "ledger"
        self._lock = threading.Lock()

    def path(self, run_id: str) -> Path:
        return self.directory / f"{run_id}.json"

    def load(self, run_id: str) -> dict[str, Any] | None:
        path = self.path(run_id)
        try:
            return dict(orjson.loads(path.read_bytes()))
        except FileNotFoundError:
            return None
        except (OSError, orjson.JSONDecodeError) as exc:
            raise FleetError(f"cannot read the ledger {path}: {exc} (set {STATE_DIR_ENV} to a writable "
                             "directory)") from exc

    def begin(self, run_id: str, *, provider: str, job: str, config: dict[str, Any],
              export_to: str | None) -> None:
        """Open (or reopen) the record of a run before anything is launched for it."""
        with self._edit(run_id) as record:
            record.update({"run_id": run_id, "provider": provider, "job": job, "config": config,
                           "export_to": export_to, "driver": driver_record()})
            record.setdefault("created", _now())
            record.setdefault("instances", {})

    def update(self, run_id: str, instance: str, state: InstanceState | None = None, **fields: Any) -> None:
        """Merge ``fields`` into one instance's record; a new ``state`` is appended to its steps."""
        with self._edit(run_id) as record:
            entry = record.setdefault("instances", {}).setdefault(instance, {"steps": []})
            entry.update(fields)
            if state is not None:
                entry["state"] = state.value
                entry["steps"].append({"state": state.value, "at": _now()})
            entry["updated"] = _now()

    def release(self, run_id: str) -> None:
        """The driver is done with the run (whatever is left is for ``fleet sweep``)."""
        with self._edit(run_id) as record:
            record.setdefault("driver", {})["released"] = True

    def runs(self) -> list[dict[str, Any]]:
        """Every run record, oldest first; unreadable files are skipped."""
        records = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else []:
            with contextlib.suppress(OSError, orjson.JSONDecodeError):
                records.append(dict(orjson.loads(path.read_bytes())))
        return records

    def entries(self) -> list[LedgerEntry]:
        """Every instance of every run, for ``teibatch fleet list``."""
        entries = []
        for record in self.runs():
            alive = driver_alive(record.get("driver", {}))
            for name, entry in record.get("instances", {}).items():
                entries.append(LedgerEntry(
                    run_id=record.get("run_id", "?"), provider=record.get("provider", "?"), instance=name,
                    host=entry.get("host"), state=InstanceState.recorded(entry.get("state")),
                    updated=entry.get("updated", ""), driver_alive=alive,
                    export=(entry.get("export") or {}).get("url"), error=entry.get("error")))
        return entries

    @contextlib.contextmanager
    def _edit(self, run_id: str) -> Iterator[dict[str, Any]]:
        with self._lock:
            record = self.load(run_id) or {}
            yield record
            record["updated"] = _now()
            self._write(self.path(run_id), orjson.dumps(record, option=orjson.OPT_INDENT_2))

    @staticmethod
    def _write(path: Path, data: bytes) -> None:
        """Replace ``path`` atomically; an OS error becomes a :class:`FleetError`."""
        tmp = None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            os.replace(tmp, path)
        except OSError as exc:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            raise FleetError(f"cannot write the ledger {path}: {exc.strerror or exc} "
                             f"(set {STATE_DIR_ENV} to a writable directory)") from exc
