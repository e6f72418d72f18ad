"""Fleets of TEI servers: providers that launch or adopt servers, export their volumes and destroy them."""

from teibatch.fleet.base import (
    Capability,
    DestroysHosts,
    ExportsVolumes,
    Instance,
    InstanceState,
    LaunchSpec,
    LostServer,
    Provider,
    ReplacesLost,
    running,
    supports,
    wait_healthy,
)
from teibatch.fleet.ledger import Ledger, LedgerEntry
from teibatch.fleet.lifecycle import ExportPlan, finish, session
from teibatch.fleet.offers import GpuWant, Offer
from teibatch.fleet.providers.lambdacloud import LambdaApi, LambdaProvider
from teibatch.fleet.providers.local import LocalProvider
from teibatch.fleet.providers.localdocker import LocalDockerProvider, docker_engine_available
from teibatch.fleet.providers.runpod import RunPodApi, RunPodProvider
from teibatch.fleet.providers.ssh import SshHost, SshProvider, read_inventory
from teibatch.fleet.providers.static import StaticProvider
from teibatch.fleet.providers.vast import VastApi, VastProvider
from teibatch.fleet.sweep import SweepResult, sweep

__all__ = [
    "Capability",
    "DestroysHosts",
    "ExportPlan",
    "ExportsVolumes",
    "GpuWant",
    "Instance",
    "InstanceState",
    "LambdaApi",
    "LambdaProvider",
    "LaunchSpec",
    "Ledger",
    "LedgerEntry",
    "LocalDockerProvider",
    "LocalProvider",
    "LostServer",
    "Offer",
    "Provider",
    "ReplacesLost",
    "RunPodApi",
    "RunPodProvider",
    "SshHost",
    "SshProvider",
    "StaticProvider",
    "SweepResult",
    "VastApi",
    "VastProvider",
    "docker_engine_available",
    "finish",
    "read_inventory",
    "running",
    "session",
    "supports",
    "sweep",
    "wait_healthy",
]
