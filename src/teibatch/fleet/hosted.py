"""TEI containers on hosts reached through a shell: what the ``ssh`` provider and ``local`` with Docker share.

Per host, ``up`` writes the ledger first, then: probe (``nvidia-smi``, ``uname -m``, the volume) →
choose the image and check the model fits → seed the volume from an earlier export if asked →
``docker run`` (loopback only, fresh API key through stdin, host-side deadline) → reach the port
(SSH tunnel, or directly) → wait for ``/health``. ``down`` removes the run's containers by label;
``export_volumes`` copies the volumes off; ``destroy`` removes volumes and runs ``destroy_command``
only where the export was verified or waived. Every step is recorded in the ledger.
"""

from __future__ import annotations

import logging
import os
import re
import secrets
import shlex
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import teibatch.fleet.containers as containers
from teibatch.endpoint import Endpoint
from teibatch.errors import (
    CapacityUnavailable,
    ExportFailed,
    FleetError,
    FleetTimeout,
    GpuUnsupported,
    RemoteCommandFailed,
    TeardownIncomplete,
)
from teibatch.fleet.base import (
    Capability,
    DestroysHosts,
    ExportsVolumes,
    Instance,
    InstanceState,
    LaunchSpec,
    Provider,
    wait_healthy,
)
from teibatch.fleet.export import export_volume, seed_volume
from teibatch.fleet.images import NVIDIA_SMI_QUERY, ContainerSpec, check_fits, choose_image, parse_nvidia_smi
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.shell import Shell, Tunnel, redact, shell_from_record

log = logging.getLogger(__name__)

DEFAULT_VOLUME = "teibatch-data"          # on the host, relative to the login directory
DEFAULT_STARTUP_TIMEOUT_S = 900.0         # image pull and model download included
DEFAULT_EXPORT_TIMEOUT_S = 3600.0
DEADLINE_MARGIN_S = 600.0                 # host-side deadline = startup + max_runtime + this
UNBOUNDED_RUNTIME_S = 24 * 3600.0         # the runtime assumed when limits.max_runtime is not set
DESTROY_TIMEOUT_S = 300.0
_NO_GPU = 126


@dataclass(frozen=True)
class HostPlan:
    """One server to launch: the host's shell, and how to destroy the host afterwards."""

    shell: Shell
    destroy_command: str | None = None    # run on this machine after the export; $TEIBATCH_HOST is set
    gpu_index: int | None = None


@dataclass
class _Slot:
    name: str
    plan: HostPlan
    state: InstanceState = InstanceState.REQUESTED
    volume: str | None = None
    port: int | None = None
    url: str | None = None
    tunnel: Tunnel | None = None
    launch_sent: bool = False
    exported: bool = False
    details: dict[str, str] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return self.plan.shell.label


def container_name(run_id: str, index: int) -> str:
    return f"teibatch-{re.sub(r'[^A-Za-z0-9_.-]', '-', run_id)}-{index}"


class ContainerProvider(Provider, ExportsVolumes, DestroysHosts):
    """TEI containers, one per :class:`HostPlan`; ``gpu`` selects GPU images (else the CPU image)."""

    capabilities = frozenset({Capability.LAUNCH, Capability.EXPORT, Capability.DESTROY, Capability.SWEEP})

    def __init__(self, hosts: list[HostPlan], *, name: str, gpu: bool = True, model_id: str | None = None,
                 image: str | None = None, volume: str = DEFAULT_VOLUME, remove_volume: bool = False,
                 server_args: tuple[str, ...] | list[str] = (), startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
                 payload_limit: int | None = None, ledger: Ledger | None = None,
                 deadline_margin: float = DEADLINE_MARGIN_S) -> None:
        self.name = name
        self.hosts = list(hosts)
        self.gpu = gpu
        self.model_id = model_id
        self.image = image
        self.volume = volume
        self.remove_volume = remove_volume
        self.server_args = tuple(server_args)
        self.startup_timeout = startup_timeout
        self.payload_limit = payload_limit
        self.ledger = ledger or Ledger()
        self.deadline_margin = deadline_margin
        self.api_key = secrets.token_urlsafe(32)
        for host in self.hosts:
            host.shell.secrets.append(self.api_key)
        self.run_id: str | None = None
        self._slots: list[_Slot] = []

    # -- up ------------------------------------------------------------------------------------------------

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        spec = spec or LaunchSpec(run_id=datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ-")
                                  + secrets.token_hex(3))
        if self._slots and self.run_id == spec.run_id:
            return self._endpoints()
        if self._slots:
            raise FleetError(f"this {self.name} provider already serves run {self.run_id}")
        self.run_id = spec.run_id
        self._slots = [_Slot(container_name(spec.run_id, i), plan) for i, plan in enumerate(self.hosts)]
        self.ledger.begin(spec.run_id, provider=self.name, job=spec.job_name, export_to=spec.export_to,
                          config={"kind": "container", "gpu": self.gpu, "remove_volume": self.remove_volume,
                                  "model_id": self.model_id, "image": self.image})
        for slot in self._slots:  # before anything happens on any host
            self._note(slot, InstanceState.REQUESTED, required=True, host=slot.label, shell=slot.plan.shell.record(),
                       destroy_command=slot.plan.destroy_command, gpu_index=slot.plan.gpu_index)
        deadline = time.monotonic() + self.startup_timeout
        for slot in self._slots:
            self._attempt(slot, lambda s=slot: self._launch(s, spec, deadline))
        for slot in self._slots:
            if slot.state is InstanceState.RUNNING:
                self._attempt(slot, lambda s=slot: self._reach(s, deadline))
        endpoints = self._endpoints()
        if not endpoints:
            reasons = "; ".join(f"{s.label}: {s.details.get('error', s.state.value)}" for s in self._slots)
            raise CapacityUnavailable(f"none of the {len(self._slots)} {self.name} servers became healthy: {reasons}")
        return endpoints

    def _attempt(self, slot: _Slot, step: Any) -> None:
        try:
            step()
        except FleetError as exc:
            message = redact(str(exc), [self.api_key])
            slot.state = InstanceState.FAILED
            slot.details["error"] = message
            self._note(slot, InstanceState.FAILED, error=message)
            log.warning("%s: going on without this server: %s", slot.label, message)

    def _probe(self, slot: _Slot, timeout: float) -> tuple[Any, str, str]:
        volume = shlex.quote(self.volume)
        parts = ["command -v docker >/dev/null 2>&1 || { echo 'docker is not on PATH' >&2; exit 127; }"]
        if self.gpu:
            index = f" -i {int(slot.plan.gpu_index)}" if slot.plan.gpu_index is not None else ""
            parts.append(f"{NVIDIA_SMI_QUERY}{index} || {{ echo 'nvidia-smi found no GPU' >&2; exit {_NO_GPU}; }}")
        parts += ["echo @@", "uname -m", "echo @@", f"mkdir -p {volume} && cd {volume} && pwd -P"]
        try:
            result = slot.plan.shell.run("; ".join(["set -e", *parts]), what="probe", timeout=timeout)
        except RemoteCommandFailed as exc:
            if exc.exit_status == _NO_GPU:
                raise GpuUnsupported(f"{slot.label}: nvidia-smi found no NVIDIA GPU") from exc
            raise
        gpu_text, platform, volume_path = (part.strip() for part in result.text.split("@@\n", 2))
        gpus = parse_nvidia_smi(gpu_text) if self.gpu else []
        if self.gpu and not gpus:
            raise GpuUnsupported(f"{slot.label}: nvidia-smi listed no GPU")
        return (gpus[0] if gpus else None), platform, volume_path

    def _launch(self, slot: _Slot, spec: LaunchSpec, deadline: float) -> None:
        gpu, platform, slot.volume = self._probe(slot, self._left(deadline))
        try:
            choice = choose_image(gpu, platform, override=self.image)
            if gpu is not None:
                check_fits(self.model_id, gpu)
        except GpuUnsupported as exc:
            raise GpuUnsupported(f"{slot.label}: {exc}") from None
        if choice.experimental:
            log.warning("%s: TEI marks the image %s as experimental", slot.label, choice.image)
        slot.details.update(image=choice.image, gpu=gpu.name if gpu else "cpu", platform=platform)
        self._note(slot, None, volume=slot.volume, image=choice.image, gpu=slot.details["gpu"], platform=platform)
        if spec.import_from:
            try:
                count = seed_volume(slot.plan.shell, spec.import_from, slot.volume, timeout=self._left(deadline))
                self._note(slot, None, imported=spec.import_from)
                log.info("%s: %d files imported from %s", slot.label, count, spec.import_from)
            except FleetError as exc:
                log.warning("%s: import from %s failed, TEI will download the model: %s", slot.label,
                            spec.import_from, exc)
        container = ContainerSpec(
            name=slot.name, image=choice.image, run_id=spec.run_id, volume=slot.volume, model_id=self.model_id,
            gpus=(None if not self.gpu else "all" if slot.plan.gpu_index is None else f"device={slot.plan.gpu_index}"),
            deadline_s=int((spec.max_runtime or UNBOUNDED_RUNTIME_S) + self.startup_timeout + self.deadline_margin),
            server_args=self.server_args)
        slot.launch_sent = True
        self._note(slot, None, required=True, launch_sent=True, host_deadline_s=container.deadline_s)
        slot.port = containers.launch(slot.plan.shell, container, self.api_key, timeout=self._left(deadline))
        self._note(slot, InstanceState.RUNNING, port=slot.port)

    def _reach(self, slot: _Slot, deadline: float) -> None:
        assert slot.port is not None
        url, slot.tunnel = slot.plan.shell.reach(slot.port, deadline)
        if not wait_healthy(url, deadline, alive=slot.tunnel.alive if slot.tunnel else None):
            tail = containers.logs_tail(slot.plan.shell, slot.name)
            raise FleetTimeout(f"{slot.label}: TEI in {slot.name} did not answer /health within "
                               f"{self.startup_timeout:.0f}s; its log ends with:\n{tail}",
                               what="health", seconds=self.startup_timeout)
        slot.url = url
        self._note(slot, InstanceState.HEALTHY)

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FleetTimeout("servers.startup_timeout passed before the server started", what="startup",
                               seconds=0.0)
        return left

    def _endpoints(self) -> list[Endpoint]:
        return [Endpoint(s.url, self.api_key, self.payload_limit) for s in self._slots
                if s.state is InstanceState.HEALTHY and s.url]

    def _note(self, slot: _Slot, state: InstanceState | None, *, required: bool = False, **fields: Any) -> None:
        """Record a step; only a ``required`` record (one before a launch) stops anything when it fails."""
        assert self.run_id is not None
        if state is not None:
            slot.state = state
        try:
            self.ledger.update(self.run_id, slot.name, state, **fields)
        except FleetError as exc:
            if required:
                raise
            log.error("%s: %s", slot.name, exc)

    # -- down, export, destroy -----------------------------------------------------------------------------

    def down(self) -> None:
        for slot in self._slots:
            if slot.tunnel is not None:
                slot.tunnel.close()
                slot.tunnel = None
        problems = []
        by_host: dict[str, list[_Slot]] = {}
        for slot in self._slots:
            if slot.state is not InstanceState.DESTROYED:
                by_host.setdefault(slot.label, []).append(slot)
        for label, slots in by_host.items():
            if not any(s.launch_sent or s.state is InstanceState.UNKNOWN for s in slots):
                for slot in slots:  # nothing was started there
                    self._note(slot, InstanceState.REMOVED)
                continue
            assert self.run_id is not None
            try:
                containers.remove_run(slots[0].plan.shell, self.run_id)
            except FleetError as exc:
                problems.append(f"{label} ({', '.join(s.name for s in slots)}): {exc}")
                for slot in slots:
                    self._note(slot, InstanceState.UNKNOWN, error=str(exc))
                continue
            for slot in slots:
                self._note(slot, InstanceState.REMOVED)
        if problems:
            raise TeardownIncomplete(
                f"run {self.run_id}: containers may still run: {'; '.join(problems)}. They stop by themselves "
                "at their host-side deadline; run `teibatch fleet sweep` to remove them now")

    def export_volumes(self, to: str, *, storage_options: Mapping[str, object] | None = None,
                       timeout: float | None = None) -> list[str]:
        urls, failures = [], []
        for slot in self._slots:
            if slot.volume is None or slot.state is InstanceState.DESTROYED:
                continue  # never reached, or its host is gone: nothing of this run to copy there
            url = f"{to.rstrip('/')}/{slot.name}"
            if not slot.exported:
                self._note(slot, None, export={"url": url, "verified": False})
                try:
                    export_volume(slot.plan.shell, slot.volume, url, timeout=timeout or DEFAULT_EXPORT_TIMEOUT_S,
                                  storage_options=storage_options,
                                  about={"run_id": self.run_id or "", "instance": slot.name})
                except ExportFailed as exc:
                    failures.append(str(exc))
                    self._note(slot, None, error=str(exc))
                    continue
                slot.exported = True
                self._note(slot, None, export={"url": url, "verified": True})
            urls.append(url)
        if failures:
            raise ExportFailed("; ".join(failures))
        return urls

    def destroy(self, *, waive_export: bool = False) -> list[str]:
        kept, problems = [], []
        for slot in self._slots:
            if slot.state is InstanceState.DESTROYED:
                continue
            destroys_host = self._destroys_host(slot)
            removes_data = bool(self.remove_volume and slot.volume) or destroys_host
            if removes_data and slot.volume is not None and not (slot.exported or waive_export):
                kept.append(slot.name)
                self._note(slot, None, kept="export not verified")
                continue
            if slot.state is not InstanceState.REMOVED and not destroys_host:
                continue  # its container was not confirmed gone: down() said so
            try:
                if self.remove_volume and slot.volume and slot.state is InstanceState.REMOVED:
                    slot.plan.shell.run(f"rm -rf -- {shlex.quote(slot.volume)}", what="remove the volume")
                if destroys_host:
                    self._destroy_host(slot)
            except FleetError as exc:
                problems.append(f"{slot.label} ({slot.name}): {exc}")
                self._note(slot, None, error=str(exc))
                continue
            self._note(slot, InstanceState.DESTROYED)
        if self.run_id is not None:
            try:
                self.ledger.release(self.run_id)
            except FleetError as exc:
                log.error("%s", exc)
        if problems:
            raise TeardownIncomplete(f"run {self.run_id}: could not destroy: {'; '.join(problems)}; "
                                     "`teibatch fleet sweep` retries")
        return kept

    def _destroys_host(self, slot: _Slot) -> bool:
        """Whether destroying ``slot`` destroys its host (and so its volume): a ``destroy_command`` here."""
        return bool(slot.plan.destroy_command)

    def _destroy_host(self, slot: _Slot) -> None:
        """Destroy the host of ``slot`` (raise a :class:`FleetError` when it could not be done)."""
        self._run_destroy_command(slot)

    def _run_destroy_command(self, slot: _Slot) -> None:
        """Run the host's ``destroy_command`` on this machine (a provider CLI call, typically)."""
        command = slot.plan.destroy_command or ""
        env = {**os.environ, "TEIBATCH_HOST": str(slot.plan.shell.record().get("address", "localhost")),
               "TEIBATCH_RUN_ID": self.run_id or "", "TEIBATCH_INSTANCE": slot.name}
        try:
            done = subprocess.run(command, shell=True, env=env, capture_output=True, timeout=DESTROY_TIMEOUT_S,
                                  start_new_session=True, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise TeardownIncomplete(f"destroy_command did not finish within {DESTROY_TIMEOUT_S:.0f}s") from None
        if done.returncode != 0:
            tail = redact((done.stderr or done.stdout).decode(errors="replace").strip()[-400:], [self.api_key])
            raise TeardownIncomplete(f"destroy_command exited with status {done.returncode}: {tail}")

    # -- what is there ---------------------------------------------------------------------------------------

    def instances(self) -> list[Instance]:
        """This run's instances, found on each host by the run label (``UNKNOWN`` where a host does not answer)."""
        found: dict[str, dict[str, str] | None] = {}
        for slot in self._slots:
            if slot.label not in found and self.run_id is not None and slot.launch_sent:
                try:
                    found[slot.label] = containers.list_run(slot.plan.shell, self.run_id)
                except FleetError:
                    found[slot.label] = None
        listed = []
        for slot in self._slots:
            on_host = found.get(slot.label, {})
            state = slot.state
            if on_host is None:
                state = InstanceState.UNKNOWN
            elif slot.name in on_host:
                running = on_host[slot.name] == "running"
                state = (slot.state if slot.state is InstanceState.HEALTHY and running
                         else InstanceState.RUNNING if running else InstanceState.FAILED)
            elif state in (InstanceState.RUNNING, InstanceState.HEALTHY):
                state = InstanceState.REMOVED  # gone from the host (its deadline passed, or removed by hand)
            listed.append(Instance(provider=self.name, id=slot.name, run_id=self.run_id or "", state=state,
                                   host=slot.label, url=slot.url, details=dict(slot.details)))
        return listed

    @classmethod
    def from_ledger(cls, record: Mapping[str, Any], ledger: Ledger) -> ContainerProvider:
        """The provider of a recorded run, holding its instances as last recorded (for ``fleet sweep``)."""
        config = record.get("config", {})
        provider = cls([], name=str(record.get("provider", "ssh")), gpu=bool(config.get("gpu", True)),
                       remove_volume=bool(config.get("remove_volume", False)), ledger=ledger)
        provider._restore(record)
        return provider

    def _restore(self, record: Mapping[str, Any]) -> None:
        """Take over the instances of a recorded run, as last recorded (entries without a shell are skipped
        when ``self.hosts`` is a cloud's: their host was never reached)."""
        self.run_id = str(record["run_id"])
        for name, entry in record.get("instances", {}).items():
            if "shell" not in entry and record.get("config", {}).get("kind") != "container":
                continue
            plan = HostPlan(shell_from_record(entry.get("shell", {"kind": "local"})),
                            entry.get("destroy_command"), entry.get("gpu_index"))
            try:
                state = InstanceState(entry.get("state", "unknown"))
            except ValueError:
                state = InstanceState.UNKNOWN
            self._slots.append(_Slot(
                name, plan, state=state, volume=entry.get("volume"), port=entry.get("port"),
                launch_sent=bool(entry.get("launch_sent")) or state is InstanceState.UNKNOWN,
                exported=bool((entry.get("export") or {}).get("verified"))))
