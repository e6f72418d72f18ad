"""TEI containers on hosts reached through a shell: what providers ``ssh``, ``local`` with Docker and ``lambda`` share.

:class:`HostedServers` is the machinery, an object each of those providers holds: :class:`ContainerProvider`
(``ssh``, ``local`` with Docker) over a fixed list of hosts, ``lambda`` over the VMs it rents. Per host,
the ledger is written first, then: probe (``nvidia-smi``, ``uname -m``, the volume) →
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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial
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
    new_run_id,
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
class HostedServer:
    """One TEI container of a run, on a host reached through a shell, as :class:`HostedServers` tracks it.

    ``name`` is the container's and the ledger entry's (``teibatch-<run id>-<n>``); ``volume`` the volume's
    path on the host; ``port`` the container's port there; ``url`` where it answers (through ``tunnel``
    when the shell needs one); ``launch_sent`` whether ``docker run`` was sent (so ``down`` looks on that
    host); ``exported`` whether the volume's copy was verified; ``details`` what ``instances()`` shows
    (image, gpu, platform, error).
    """

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

    def close_tunnel(self) -> None:
        """Close the tunnel to the server's port, if one is open."""
        if self.tunnel is not None:
            self.tunnel.close()
            self.tunnel = None


def container_name(run_id: str, index: int) -> str:
    return f"teibatch-{re.sub(r'[^A-Za-z0-9_.-]', '-', run_id)}-{index}"


class HostedServers:
    """The TEI containers of one run on hosts reached through a shell: launched, reached, removed, exported
    and destroyed, each step recorded in the ledger; ``gpu`` selects GPU images (else the CPU image).

    A provider holds one and adds each host with :meth:`add` once it is reachable. ``destroy_host``, when
    given, destroys every host (``lambda``: terminate the VM); else a host is destroyed only where its
    plan has a ``destroy_command``, by running it.
    """

    def __init__(self, *, name: str, gpu: bool = True, model_id: str | None = None, image: str | None = None,
                 volume: str = DEFAULT_VOLUME, remove_volume: bool = False,
                 server_args: tuple[str, ...] | list[str] = (), startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
                 payload_limit: int | None = None, ledger: Ledger | None = None,
                 deadline_margin: float = DEADLINE_MARGIN_S,
                 destroy_host: Callable[[HostedServer], None] | None = None) -> None:
        self.name = name
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
        self.destroy_host = destroy_host
        self.api_key = secrets.token_urlsafe(32)
        self.run_id: str | None = None
        self.servers: list[HostedServer] = []

    # -- up ------------------------------------------------------------------------------------------------

    def begin(self, spec: LaunchSpec, config: Mapping[str, Any]) -> None:
        """Start run ``spec.run_id`` in the ledger, before anything is launched (``config``: what ``fleet
        sweep`` needs to take the run back, never a secret)."""
        self.run_id = spec.run_id
        self.ledger.begin(spec.run_id, provider=self.name, job=spec.job_name, export_to=spec.export_to,
                          config=dict(config))

    def add(self, name: str, plan: HostPlan) -> HostedServer:
        """A server to launch on ``plan``'s host (its shell redacts the run's API key from then on)."""
        plan.shell.secrets.append(self.api_key)
        server = HostedServer(name, plan)
        self.servers.append(server)
        return server

    def attempt(self, server: HostedServer, step: Callable[[], None]) -> None:
        """Run one step of ``server``'s start; a :class:`FleetError` marks it failed and the run goes on without it."""
        try:
            step()
        except FleetError as exc:
            message = redact(str(exc), [self.api_key])
            server.state = InstanceState.FAILED
            server.details["error"] = message
            self.note(server, InstanceState.FAILED, error=message)
            log.warning("%s: going on without this server: %s", server.label, message)

    def _probe(self, server: HostedServer, timeout: float) -> tuple[Any, str, str]:
        volume = shlex.quote(self.volume)
        parts = ["command -v docker >/dev/null 2>&1 || { echo 'docker is not on PATH' >&2; exit 127; }"]
        if self.gpu:
            index = f" -i {int(server.plan.gpu_index)}" if server.plan.gpu_index is not None else ""
            parts.append(f"{NVIDIA_SMI_QUERY}{index} || {{ echo 'nvidia-smi found no GPU' >&2; exit {_NO_GPU}; }}")
        parts += ["echo @@", "uname -m", "echo @@", f"mkdir -p {volume} && cd {volume} && pwd -P"]
        try:
            result = server.plan.shell.run("; ".join(["set -e", *parts]), what="probe", timeout=timeout)
        except RemoteCommandFailed as exc:
            if exc.exit_status == _NO_GPU:
                raise GpuUnsupported(f"{server.label}: nvidia-smi found no NVIDIA GPU") from exc
            raise
        gpu_text, platform, volume_path = (part.strip() for part in result.text.split("@@\n", 2))
        gpus = parse_nvidia_smi(gpu_text) if self.gpu else []
        if self.gpu and not gpus:
            raise GpuUnsupported(f"{server.label}: nvidia-smi listed no GPU")
        return (gpus[0] if gpus else None), platform, volume_path

    def launch(self, server: HostedServer, spec: LaunchSpec, deadline: float) -> None:
        """Probe ``server``'s host, choose the image, seed the volume if asked, and ``docker run`` TEI there
        (by ``deadline``, monotonic); RUNNING when the container started."""
        gpu, platform, server.volume = self._probe(server, self._left(deadline))
        try:
            choice = choose_image(gpu, platform, override=self.image)
            if gpu is not None:
                check_fits(self.model_id, gpu)
        except GpuUnsupported as exc:
            raise GpuUnsupported(f"{server.label}: {exc}") from None
        if choice.experimental:
            log.warning("%s: TEI marks the image %s as experimental", server.label, choice.image)
        server.details.update(image=choice.image, gpu=gpu.name if gpu else "cpu", platform=platform)
        self.note(server, None, volume=server.volume, image=choice.image, gpu=server.details["gpu"], platform=platform)
        if spec.import_from:
            try:
                count = seed_volume(server.plan.shell, spec.import_from, server.volume, timeout=self._left(deadline))
                self.note(server, None, imported=spec.import_from)
                log.info("%s: %d files imported from %s", server.label, count, spec.import_from)
            except FleetError as exc:
                log.warning("%s: import from %s failed, TEI will download the model: %s", server.label,
                            spec.import_from, exc)
        index = server.plan.gpu_index
        container = ContainerSpec(
            name=server.name, image=choice.image, run_id=spec.run_id, volume=server.volume, model_id=self.model_id,
            gpus=(None if not self.gpu else "all" if index is None else f"device={index}"),
            deadline_s=int((spec.max_runtime or UNBOUNDED_RUNTIME_S) + self.startup_timeout + self.deadline_margin),
            server_args=self.server_args, entrypoint=choice.entrypoint)
        server.launch_sent = True
        self.note(server, None, required=True, launch_sent=True, host_deadline_s=container.deadline_s)
        server.port = containers.launch(server.plan.shell, container, self.api_key, timeout=self._left(deadline))
        self.note(server, InstanceState.RUNNING, port=server.port)

    def reach(self, server: HostedServer, deadline: float) -> None:
        """Reach a running ``server``'s port (a tunnel where the shell needs one) and wait for ``/health``;
        HEALTHY when it answers by ``deadline``."""
        assert server.port is not None
        url, server.tunnel = server.plan.shell.reach(server.port, deadline)
        if not wait_healthy(url, deadline, alive=server.tunnel.alive if server.tunnel else None):
            tail = containers.logs_tail(server.plan.shell, server.name)
            raise FleetTimeout(f"{server.label}: TEI in {server.name} did not answer /health within "
                               f"{self.startup_timeout:.0f}s; its log ends with:\n{tail}",
                               what="health", seconds=self.startup_timeout)
        server.url = url
        self.note(server, InstanceState.HEALTHY)

    @staticmethod
    def _left(deadline: float) -> float:
        left = deadline - time.monotonic()
        if left <= 0:
            raise FleetTimeout("servers.startup_timeout passed before the server started", what="startup",
                               seconds=0.0)
        return left

    def endpoints(self) -> list[Endpoint]:
        """The healthy servers, as the pool reaches them (with the run's API key)."""
        return [Endpoint(s.url, self.api_key, self.payload_limit) for s in self.servers
                if s.state is InstanceState.HEALTHY and s.url]

    def note(self, server: HostedServer, state: InstanceState | None, *, required: bool = False, **fields: Any) -> None:
        """Record a step; only a ``required`` record (one before a launch) stops anything when it fails."""
        assert self.run_id is not None
        if state is not None:
            server.state = state
        try:
            self.ledger.update(self.run_id, server.name, state, **fields)
        except FleetError as exc:
            if required:
                raise
            log.error("%s: %s", server.name, exc)

    # -- down, export, destroy -----------------------------------------------------------------------------

    def down(self) -> None:
        """Close the tunnels and remove the run's containers, host by host (see :meth:`Provider.down`)."""
        for server in self.servers:
            server.close_tunnel()
        problems = []
        by_host: dict[str, list[HostedServer]] = {}
        for server in self.servers:
            if server.state is not InstanceState.DESTROYED:
                by_host.setdefault(server.label, []).append(server)
        for label, group in by_host.items():
            if not any(s.launch_sent or s.state is InstanceState.UNKNOWN for s in group):
                for server in group:  # nothing was started there
                    self.note(server, InstanceState.REMOVED)
                continue
            assert self.run_id is not None
            try:
                containers.remove_run(group[0].plan.shell, self.run_id)
            except FleetError as exc:
                problems.append(f"{label} ({', '.join(s.name for s in group)}): {exc}")
                for server in group:
                    self.note(server, InstanceState.UNKNOWN, error=str(exc))
                continue
            for server in group:
                self.note(server, InstanceState.REMOVED)
        if problems:
            raise TeardownIncomplete(
                f"run {self.run_id}: containers may still run: {'; '.join(problems)}. They stop by themselves "
                "at their host-side deadline; run `teibatch fleet sweep` to remove them now")

    def export_volumes(self, to: str, *, storage_options: Mapping[str, object] | None = None,
                       timeout: float | None = None) -> list[str]:
        """Copy each reached volume to ``<to>/<name>`` (see :meth:`ExportsVolumes.export_volumes`)."""
        urls, failures = [], []
        for server in self.servers:
            if server.volume is None or server.state is InstanceState.DESTROYED:
                continue  # never reached, or its host is gone: nothing of this run to copy there
            url = f"{to.rstrip('/')}/{server.name}"
            if not server.exported:
                self.note(server, None, export={"url": url, "verified": False})
                try:
                    export_volume(server.plan.shell, server.volume, url, timeout=timeout or DEFAULT_EXPORT_TIMEOUT_S,
                                  storage_options=storage_options,
                                  about={"run_id": self.run_id or "", "instance": server.name})
                except ExportFailed as exc:
                    failures.append(str(exc))
                    self.note(server, None, error=str(exc))
                    continue
                server.exported = True
                self.note(server, None, export={"url": url, "verified": True})
            urls.append(url)
        if failures:
            raise ExportFailed("; ".join(failures))
        return urls

    def destroy(self, *, waive_export: bool = False) -> list[str]:
        """Remove volumes and destroy hosts where the export was verified or waived (see
        :meth:`DestroysHosts.destroy`)."""
        kept, problems = [], []
        for server in self.servers:
            if server.state is InstanceState.DESTROYED:
                continue
            # destroying the host (every host with destroy_host, else one with a destroy_command) takes its volume
            destroys_host = self.destroy_host is not None or bool(server.plan.destroy_command)
            removes_data = bool(self.remove_volume and server.volume) or destroys_host
            if removes_data and server.volume is not None and not (server.exported or waive_export):
                kept.append(server.name)
                self.note(server, None, kept="export not verified")
                continue
            if server.state is not InstanceState.REMOVED and not destroys_host:
                continue  # its container was not confirmed gone: down() said so
            try:
                if self.remove_volume and server.volume and server.state is InstanceState.REMOVED:
                    server.plan.shell.run(f"rm -rf -- {shlex.quote(server.volume)}", what="remove the volume")
                if self.destroy_host is not None:
                    self.destroy_host(server)
                elif destroys_host:
                    self._run_destroy_command(server)
            except FleetError as exc:
                problems.append(f"{server.label} ({server.name}): {exc}")
                self.note(server, None, error=str(exc))
                continue
            self.note(server, InstanceState.DESTROYED)
        if self.run_id is not None:
            try:
                self.ledger.release(self.run_id)
            except FleetError as exc:
                log.error("%s", exc)
        if problems:
            raise TeardownIncomplete(f"run {self.run_id}: could not destroy: {'; '.join(problems)}; "
                                     "`teibatch fleet sweep` retries")
        return kept

    def _run_destroy_command(self, server: HostedServer) -> None:
        """Run the host's ``destroy_command`` on this machine (a provider CLI call, typically)."""
        command = server.plan.destroy_command or ""
        env = {**os.environ, "TEIBATCH_HOST": str(server.plan.shell.record().get("address", "localhost")),
               "TEIBATCH_RUN_ID": self.run_id or "", "TEIBATCH_INSTANCE": server.name}
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
        for server in self.servers:
            if server.label not in found and self.run_id is not None and server.launch_sent:
                try:
                    found[server.label] = containers.list_run(server.plan.shell, self.run_id)
                except FleetError:
                    found[server.label] = None
        listed = []
        for server in self.servers:
            on_host = found.get(server.label, {})
            state = server.state
            if on_host is None:
                state = InstanceState.UNKNOWN
            elif server.name in on_host:
                running = on_host[server.name] == "running"
                state = (server.state if server.state is InstanceState.HEALTHY and running
                         else InstanceState.RUNNING if running else InstanceState.FAILED)
            elif state in (InstanceState.RUNNING, InstanceState.HEALTHY):
                state = InstanceState.REMOVED  # gone from the host (its deadline passed, or removed by hand)
            listed.append(Instance(provider=self.name, id=server.name, run_id=self.run_id or "", state=state,
                                   host=server.label, url=server.url, details=dict(server.details)))
        return listed

    def restore(self, record: Mapping[str, Any]) -> None:
        """Take over the instances of a recorded run, as last recorded (for ``fleet sweep``; entries without a
        shell are skipped when the run rented its hosts: those hosts were never reached)."""
        self.run_id = str(record["run_id"])
        for name, entry in record.get("instances", {}).items():
            if "shell" not in entry and record.get("config", {}).get("kind") != "container":
                continue
            plan = HostPlan(shell_from_record(entry.get("shell", {"kind": "local"})),
                            entry.get("destroy_command"), entry.get("gpu_index"))
            state = InstanceState.recorded(entry.get("state"))
            self.servers.append(HostedServer(
                name, plan, state=state, volume=entry.get("volume"), port=entry.get("port"),
                launch_sent=bool(entry.get("launch_sent")) or state is InstanceState.UNKNOWN,
                exported=bool((entry.get("export") or {}).get("verified"))))


class HostedProvider(Provider, ExportsVolumes, DestroysHosts):
    """A provider whose servers are the :class:`HostedServers` it holds as ``hosted`` (providers ``ssh``,
    ``local`` with Docker, and ``lambda``): what it does not add, ``hosted`` does."""

    capabilities = frozenset({Capability.LAUNCH, Capability.EXPORT, Capability.DESTROY, Capability.SWEEP})
    hosted: HostedServers

    def down(self) -> None:
        self.hosted.down()

    def export_volumes(self, to: str, *, storage_options: Mapping[str, object] | None = None,
                       timeout: float | None = None) -> list[str]:
        return self.hosted.export_volumes(to, storage_options=storage_options, timeout=timeout)

    def destroy(self, *, waive_export: bool = False) -> list[str]:
        return self.hosted.destroy(waive_export=waive_export)

    def instances(self) -> list[Instance]:
        return self.hosted.instances()


class ContainerProvider(HostedProvider):
    """TEI containers on a fixed list of hosts, one per :class:`HostPlan` (providers ``ssh`` and ``local``
    with Docker); ``options`` are :class:`HostedServers`'s."""

    def __init__(self, hosts: list[HostPlan], *, name: str, gpu: bool = True, **options: Any) -> None:
        self.name = name
        self.hosts = list(hosts)
        self.hosted = HostedServers(name=name, gpu=gpu, **options)
        self.ledger = self.hosted.ledger

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        hosted = self.hosted
        spec = spec or LaunchSpec(run_id=new_run_id())
        if hosted.servers and hosted.run_id == spec.run_id:
            return hosted.endpoints()
        if hosted.servers:
            raise FleetError(f"this {self.name} provider already serves run {hosted.run_id}")
        servers = [hosted.add(container_name(spec.run_id, i), plan) for i, plan in enumerate(self.hosts)]
        hosted.begin(spec, {"kind": "container", "gpu": hosted.gpu, "remove_volume": hosted.remove_volume,
                            "model_id": hosted.model_id, "image": hosted.image})
        for server in servers:  # before anything happens on any host
            hosted.note(server, InstanceState.REQUESTED, required=True, host=server.label,
                        shell=server.plan.shell.record(), destroy_command=server.plan.destroy_command,
                        gpu_index=server.plan.gpu_index)
        deadline = time.monotonic() + hosted.startup_timeout
        for server in servers:
            hosted.attempt(server, partial(hosted.launch, server, spec, deadline))
        for server in servers:
            if server.state is InstanceState.RUNNING:
                hosted.attempt(server, partial(hosted.reach, server, deadline))
        endpoints = hosted.endpoints()
        if not endpoints:
            reasons = "; ".join(f"{s.label}: {s.details.get('error', s.state.value)}" for s in servers)
            raise CapacityUnavailable(f"none of the {len(servers)} {self.name} servers became healthy: {reasons}")
        return endpoints

    @classmethod
    def from_ledger(cls, record: Mapping[str, Any], ledger: Ledger) -> ContainerProvider:
        """The provider of a recorded run, holding its instances as last recorded (for ``fleet sweep``)."""
        config = record.get("config", {})
        provider = cls([], name=str(record.get("provider", "ssh")), gpu=bool(config.get("gpu", True)),
                       remove_volume=bool(config.get("remove_volume", False)), ledger=ledger)
        provider.hosted.restore(record)
        return provider
