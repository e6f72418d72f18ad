"""From the job file's ``servers`` and ``export`` sections to a fleet provider and its session."""

from __future__ import annotations

import os
from contextlib import AbstractContextManager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from teibatch.endpoint import Endpoint
from teibatch.errors import FleetError, JobSpecError
from teibatch.fleet import (
    ExportPlan,
    LaunchSpec,
    LocalDockerProvider,
    LocalProvider,
    Provider,
    SshHost,
    SshProvider,
    StaticProvider,
    docker_engine_available,
    read_inventory,
    session,
)
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.cost import run_cost
from teibatch.fleet.hosted import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_VOLUME
from teibatch.fleet.lambdacloud import LambdaApi, LambdaProvider, SshLogin
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import Capacity, GpuWant
from teibatch.fleet.runpod import RunPodApi, RunPodProvider
from teibatch.fleet.vast import DEFAULT_MIN_RELIABILITY, VastApi, VastProvider
from teibatch.fleet.vast import DEFAULT_MODEL_DIR as VAST_MODEL_DIR
from teibatch.fleet.vast import SSH_PORT as VAST_SSH_PORT
from teibatch.fleet.vast import SSH_USER as VAST_SSH_USER
from teibatch.job import JobSpec, SshHostSection

BUILTIN_MODEL_PREFIX = "teibatch/"  # models only the built-in server serves


def api_key_from_env(job: JobSpec, environ: dict[str, str] | None = None) -> str | None:
    """The API key named by ``servers.api_key_env``; a named but unset variable is a job error."""
    name = job.servers.api_key_env
    if not name:
        return None
    value = (os.environ if environ is None else environ).get(name)
    if not value:
        raise JobSpecError(f"the environment variable {name} is not set; it should hold the servers' API key",
                           key="servers.api_key_env")
    return value


def provider_for(job: JobSpec) -> Provider:
    """The provider the job asks for, configured; launches nothing yet."""
    servers = job.servers
    payload_limit = job.client.payload_limit
    if servers.provider == "static":
        return StaticProvider([s.url for s in servers.urls], api_key=api_key_from_env(job),
                              startup_timeout=servers.startup_timeout, payload_limit=payload_limit,
                              payload_limits={s.url: s.payload_limit for s in servers.urls if s.payload_limit})
    if servers.provider == "ssh":
        return _ssh_provider(job)
    if servers.provider == "lambda":
        return _lambda_provider(job)
    if servers.provider == "runpod":
        return _runpod_provider(job)
    if servers.provider == "vast":
        return _vast_provider(job)
    if local_engine(job) == "docker":
        _needs_model(job)
        options = {"volume": servers.volume} if servers.volume else {}
        return LocalDockerProvider(servers.count, model_id=job.model.id, image=servers.image,
                                   remove_volume=servers.remove_volume, server_args=tuple(servers.server_args),
                                   startup_timeout=_startup_timeout(job), payload_limit=payload_limit, **options)
    return LocalProvider(servers.count, model_id=job.model.id, server_args=list(servers.server_args),
                         startup_timeout=servers.startup_timeout, payload_limit=payload_limit)


def local_engine(job: JobSpec) -> str:
    """``builtin`` or ``docker``: ``auto`` means Docker when an engine answers and TEI can serve the model."""
    engine = job.servers.engine
    if engine != "auto":
        return engine
    model = job.model.id or ""
    if not model or model.startswith(BUILTIN_MODEL_PREFIX):
        return "builtin"
    return "docker" if docker_engine_available() else "builtin"


def _startup_timeout(job: JobSpec) -> float:
    """The job's ``servers.startup_timeout``, or 15 minutes for launched containers (image pull, download)."""
    if "startup_timeout" in job.servers.model_fields_set:
        return job.servers.startup_timeout
    return DEFAULT_STARTUP_TIMEOUT_S


def ssh_hosts(job: JobSpec) -> list[SshHost]:
    """The hosts of ``servers.hosts`` and of the ``servers.inventory`` file, validated."""
    sections = list(job.servers.hosts)
    inventory = job.servers.inventory
    if inventory:
        try:
            raw = read_inventory(inventory)
            for index, host in enumerate(raw):
                try:
                    sections.append(SshHostSection.model_validate(host))
                except ValidationError as exc:
                    first = exc.errors()[0]
                    where = ".".join(str(part) for part in (index, *first["loc"]))
                    raise JobSpecError(f"{inventory}: hosts.{where}: {first['msg']}",
                                       key="servers.inventory") from None
        except (OSError, ValueError, yaml.YAMLError) as exc:
            raise JobSpecError(f"cannot read the inventory {inventory}: {exc}", key="servers.inventory") from None
    return [SshHost(**section.model_dump()) for section in sections]


def _needs_model(job: JobSpec) -> None:
    if not job.model.id:
        raise JobSpecError("TEI containers need the model to serve: set model.id (a Hugging Face model id)",
                           key="model.id")


def _ssh_provider(job: JobSpec) -> SshProvider:
    servers = job.servers
    _needs_model(job)
    hosts = ssh_hosts(job)
    destroys = servers.remove_volume or any(h.destroy_command for h in hosts)
    if destroys and not job.export.to and not job.export.waive:
        raise JobSpecError("the job destroys volumes or hosts (servers.remove_volume or a destroy_command) but "
                           "says nowhere to copy the volumes first: set export.to, or export.waive: true",
                           key="export")
    return SshProvider(hosts, model_id=job.model.id, image=servers.image, volume=servers.volume or DEFAULT_VOLUME,
                       remove_volume=servers.remove_volume, server_args=tuple(servers.server_args),
                       startup_timeout=_startup_timeout(job), payload_limit=job.client.payload_limit)


def gpu_want(job: JobSpec) -> GpuWant:
    """The cards a cloud job may rent (``servers.gpu``, ``min_vram_gb``, ``max_price``, ``regions``)."""
    servers = job.servers
    return GpuWant(names=servers.gpu, min_vram_gb=servers.min_vram_gb, max_price=servers.max_price,
                   regions=servers.regions)


def cloud_api(job: JobSpec, capacity: Capacity | None = None) -> LambdaApi | RunPodApi | VastApi:
    """The API of the job's GPU cloud, with the key from the environment or the cloud's config file; on Vast,
    searching the offers of ``capacity`` (default: the job's ``servers.capacity``)."""
    servers = job.servers
    if servers.provider == "lambda":
        return LambdaApi()
    if servers.provider == "vast":
        return VastApi(want=gpu_want(job), capacity=capacity or servers.capacity, disk_gb=servers.container_disk_gb,
                       min_reliability=DEFAULT_MIN_RELIABILITY if servers.min_reliability is None
                       else servers.min_reliability)
    return RunPodApi(cloud_type=servers.cloud_type)


def _lambda_provider(job: JobSpec) -> LambdaProvider:
    servers = job.servers
    _needs_model(job)
    if not job.export.to and not job.export.waive:
        raise JobSpecError("terminating a Lambda instance destroys its disk (the model weights): set export.to to "
                           "copy the volume off first, or export.waive: true", key="export")
    assert servers.ssh_key_name is not None  # the job file's validation requires it
    return LambdaProvider(LambdaApi(), count=servers.count, want=gpu_want(job), ssh_key_name=servers.ssh_key_name,
                          login=SshLogin(user=servers.ssh_user, port=servers.ssh_port, key_file=servers.key_file),
                          max_replacements=servers.max_replacements, model_id=job.model.id, image=servers.image,
                          volume=servers.volume or DEFAULT_VOLUME, remove_volume=servers.remove_volume,
                          server_args=tuple(servers.server_args), startup_timeout=_startup_timeout(job),
                          payload_limit=job.client.payload_limit)


def _runpod_provider(job: JobSpec) -> RunPodProvider:
    servers = job.servers
    _needs_model(job)
    if job.export.to:
        raise JobSpecError("a RunPod pod has no shell to copy its volume through: keep the model weights in a "
                           "network volume (servers.network_volume_id) and remove export.to", key="export.to")
    if not servers.network_volume_id and not job.export.waive:
        raise JobSpecError("terminating a RunPod pod destroys its container disk (the model weights): set "
                           "servers.network_volume_id to keep them in a network volume, or export.waive: true",
                           key="export")
    return RunPodProvider(RunPodApi(cloud_type=servers.cloud_type), count=servers.count, want=gpu_want(job),
                          model_id=job.model.id, image=servers.image, server_args=tuple(servers.server_args),
                          startup_timeout=_startup_timeout(job), max_replacements=servers.max_replacements,
                          network_volume_id=servers.network_volume_id, container_disk_gb=servers.container_disk_gb,
                          payload_limit=job.client.payload_limit, capacity=servers.capacity)


def _vast_provider(job: JobSpec) -> VastProvider:
    servers = job.servers
    _needs_model(job)
    if not job.export.to and not job.export.waive:
        raise JobSpecError("destroying a Vast instance destroys its disk (the model weights): set export.to (and "
                           "servers.key_file) to copy them off over SSH first, or export.waive: true", key="export")
    login = None
    if job.export.to or job.export.import_from:
        if not servers.key_file:
            what, instead = (("export.to on provider vast copies the model directory off each instance",
                              "export.waive: true without export.to") if job.export.to else
                             ("export.import_from on provider vast copies the earlier export into each instance",
                              "remove export.import_from (each instance then downloads the model)"))
            raise JobSpecError(f"{what} over SSH: set servers.key_file to your private key (its public key, "
                               f"<key_file>.pub, is attached to each instance), or {instead}",
                               key="servers.key_file")
        if servers.volume and not servers.volume.startswith("/"):
            raise JobSpecError(f"servers.volume: {servers.volume!r}: on provider vast it is the model directory "
                               "inside the instance (TEI's --huggingface-hub-cache), an absolute path",
                               key="servers.volume")
        user = servers.ssh_user if "ssh_user" in servers.model_fields_set else VAST_SSH_USER
        login = SshLogin(user=user, port=VAST_SSH_PORT, key_file=servers.key_file)
    api = cloud_api(job)
    assert isinstance(api, VastApi)
    return VastProvider(api, count=servers.count, want=gpu_want(job), model_id=job.model.id, image=servers.image,
                        server_args=tuple(servers.server_args), startup_timeout=_startup_timeout(job),
                        max_replacements=servers.max_replacements, disk_gb=servers.container_disk_gb,
                        payload_limit=job.client.payload_limit, capacity=servers.capacity, login=login,
                        model_dir=servers.volume or VAST_MODEL_DIR)


def fleet_session(job: JobSpec, provider: Provider, run_id: str) -> AbstractContextManager[list[Endpoint]]:
    """The provider's servers for one run: up, then down, export and destroy however the run ends."""
    export = job.export
    to = export.to
    if to and "://" not in to:
        to = str(Path(to).expanduser().absolute())
    spec = LaunchSpec(run_id=run_id, job_name=job.name, max_runtime=job.limits.max_runtime,
                      import_from=export.import_from, export_to=to)
    return session(provider, spec, ExportPlan(to=to, waive=export.waive, timeout=export.timeout,
                                              storage_options=dict(export.storage_options)))


def fleet_record(provider: Provider, run_id: str, started_at: str) -> tuple[dict[str, Any] | None,
                                                                             list[dict[str, Any]]]:
    """What the ledger says of this run's instances, read once after teardown: what they cost
    (``fleet/cost.py``; ``None`` unless the provider rents) and every step recorded for each
    (requested, running, healthy, removed, destroyed...) as run events, ``t`` in seconds since
    ``started_at`` (ISO), oldest first. Nothing for a provider without a ledger."""
    ledger = getattr(provider, "ledger", None)
    try:
        record = ledger.load(run_id) if isinstance(ledger, Ledger) else None
    except FleetError:  # an unreadable ledger costs the report these sections, not the run
        return None, []
    if record is None:
        return None, []
    rule = billing_rules().get(provider.name)
    origin = datetime.fromisoformat(started_at)
    events = [{"t": round((datetime.fromisoformat(step["at"]) - origin).total_seconds(), 3),
               "event": f"instance_{step['state']}", "message": f"{name}: {step['state']}", "instance": name}
              for name, entry in sorted(record.get("instances", {}).items()) for step in entry.get("steps", [])]
    return (run_cost(record, rule) if rule is not None else None), sorted(events, key=lambda event: event["t"])
