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
from teibatch.fleet.lambdacloud import LambdaApi, LambdaProvider
from teibatch.fleet.ledger import Ledger, LedgerEntry
from teibatch.fleet.lifecycle import ExportPlan, finish, session
from teibatch.fleet.local import LocalProvider
from teibatch.fleet.localdocker import LocalDockerProvider, docker_engine_available
from teibatch.fleet.offers import GpuWant, Offer
from teibatch.fleet.runpod import RunPodApi, RunPodProvider
from teibatch.fleet.ssh import SshHost, SshProvider, read_inventory
from teibatch.fleet.static import StaticProvider
from teibatch.fleet.sweep import SweepResult, sweep
from teibatch.fleet.vast import VastApi, VastProvider

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
