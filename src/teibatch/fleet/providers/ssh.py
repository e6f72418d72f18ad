"""Provider ``ssh``: TEI on GPU hosts you reach with SSH (rented "raw GPU" instances, your own servers).

For each host: ``nvidia-smi`` tells the card, ``configs/images.yaml`` the image, ``docker run -d``
starts TEI bound to the host's loopback with a fresh API key per run, an ``ssh -L`` tunnel brings its
port to this machine. Host requirements: an SSH login (key file, optionally through a jump host),
``docker`` with the NVIDIA Container Toolkit, ``nvidia-smi``, ``tar`` and ``sha256sum``. The shared
launch / export / destroy logic is :class:`~teibatch.fleet.hosted.ContainerProvider`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from teibatch.errors import JobSpecError
from teibatch.fleet.hosted import ContainerProvider, HostPlan
from teibatch.fleet.shell import SshShell, SshTarget


@dataclass(frozen=True)
class SshHost:
    """One host of the job file's ``servers.hosts`` (or of the inventory file)."""

    address: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    jump_host: str | None = None
    destroy_command: str | None = None
    gpu_index: int | None = None
    known_hosts: str | None = None
    host_key_checking: str = "yes"

    def plan(self) -> HostPlan:
        target = SshTarget(address=self.address, port=self.port, user=self.user,
                           key_file=str(Path(self.key_file).expanduser()) if self.key_file else None,
                           jump_host=self.jump_host,
                           known_hosts=str(Path(self.known_hosts).expanduser()) if self.known_hosts else None,
                           host_key_checking=self.host_key_checking)
        return HostPlan(SshShell(target), self.destroy_command, self.gpu_index)


class SshProvider(ContainerProvider):
    """One TEI container per host; see :class:`~teibatch.fleet.hosted.ContainerProvider` for the options."""

    def __init__(self, hosts: list[SshHost], **options: Any) -> None:
        super().__init__([host.plan() for host in hosts], name="ssh", gpu=True, **options)


def read_inventory(path: str | Path) -> list[dict[str, Any]]:
    """The hosts of an inventory file: a YAML list of hosts, or a mapping with a ``hosts`` list.

    Raises :class:`JobSpecError` (key ``servers.inventory``) when the file cannot be read or has another shape.
    """
    try:
        data = yaml.safe_load(Path(path).expanduser().read_text(encoding="utf-8"))
    except (OSError, ValueError, yaml.YAMLError) as exc:
        raise JobSpecError(f"cannot read the inventory {path}: {exc}", key="servers.inventory") from None
    hosts = data.get("hosts") if isinstance(data, dict) else data
    if not isinstance(hosts, list) or not all(isinstance(h, dict) for h in hosts):
        raise JobSpecError(f"cannot read the inventory {path}: expected a list of hosts (address, port, user, "
                           "key_file, ...) or a mapping with 'hosts:'", key="servers.inventory")
    return hosts
