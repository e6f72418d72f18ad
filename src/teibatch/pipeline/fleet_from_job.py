"""From the job file's ``servers`` section to a configured provider, and to its GPU cloud's API.

Here, on the pipeline's side, the job becomes what the fleet takes: the providers' own arguments (the
model id, the client's payload limit, where the export goes); nothing in ``fleet/`` reads the job.
Every check that only a provider's construction makes (an API key variable set, an export named
before volumes are destroyed) raises :class:`~teibatch.errors.JobSpecError` naming the key, before
anything is launched.
"""

from __future__ import annotations

import os

from teibatch.errors import JobSpecError
from teibatch.fleet.base import Provider
from teibatch.fleet.hosted import DEFAULT_STARTUP_TIMEOUT_S, DEFAULT_VOLUME
from teibatch.fleet.offers import Capacity, GpuWant
from teibatch.fleet.providers.lambdacloud import LambdaApi, LambdaProvider
from teibatch.fleet.providers.local import LocalProvider, check_model
from teibatch.fleet.providers.localdocker import LocalDockerProvider, docker_engine_available
from teibatch.fleet.providers.runpod import RunPodApi, RunPodProvider
from teibatch.fleet.providers.ssh import SshHost, SshProvider
from teibatch.fleet.providers.static import StaticProvider
from teibatch.fleet.providers.vast import DEFAULT_MIN_RELIABILITY, VastApi, VastProvider
from teibatch.fleet.providers.vast import DEFAULT_MODEL_DIR as VAST_MODEL_DIR
from teibatch.fleet.providers.vast import SSH_PORT as VAST_SSH_PORT
from teibatch.fleet.providers.vast import SSH_USER as VAST_SSH_USER
from teibatch.fleet.shell import SshLogin
from teibatch.job import ServersSection

BUILTIN_MODEL_PREFIX = "teibatch/"  # models only the built-in server serves


def provider_for(servers: ServersSection, *, model_id: str | None, payload_limit: int | None = None,
                 export_to: str | None = None, waive_export: bool = False,
                 import_from: str | None = None) -> Provider:
    """The provider ``servers`` asks for, configured; launches nothing yet. ``export_to`` and
    ``waive_export`` are the job's ``export.to`` and ``export.waive``: a provider that destroys volumes
    refuses a job that says neither. ``import_from`` (``export.import_from``) decides whether a Vast
    instance must be reachable over SSH."""
    if servers.provider == "static":
        return StaticProvider([s.url for s in servers.urls], api_key=api_key_from_env(servers),
                              startup_timeout=servers.startup_timeout, payload_limit=payload_limit,
                              payload_limits={s.url: s.payload_limit for s in servers.urls if s.payload_limit})
    if servers.provider == "ssh":
        return _ssh_provider(servers, model_id, payload_limit, export_to, waive_export)
    if servers.provider == "lambda":
        return _lambda_provider(servers, model_id, payload_limit, export_to, waive_export)
    if servers.provider == "runpod":
        return _runpod_provider(servers, model_id, payload_limit, export_to, waive_export)
    if servers.provider == "vast":
        return _vast_provider(servers, model_id, payload_limit, export_to, waive_export, import_from)
    if local_engine(servers, model_id) == "docker":
        _needs_model(model_id)
        options = {"volume": servers.volume} if servers.volume else {}
        return LocalDockerProvider(servers.count, model_id=model_id, image=servers.image,
                                   remove_volume=servers.remove_volume, server_args=tuple(servers.server_args),
                                   startup_timeout=_startup_timeout(servers), payload_limit=payload_limit, **options)
    check_model(model_id, servers.server_args)
    return LocalProvider(servers.count, model_id=model_id, server_args=list(servers.server_args),
                         startup_timeout=servers.startup_timeout, payload_limit=payload_limit)


def api_key_from_env(servers: ServersSection) -> str | None:
    """The API key named by ``servers.api_key_env``; a named but unset variable is a job error."""
    name = servers.api_key_env
    if not name:
        return None
    value = os.environ.get(name)
    if not value:
        raise JobSpecError(f"the environment variable {name} is not set; it should hold the servers' API key",
                           key="servers.api_key_env")
    return value


def check_builtin_model(servers: ServersSection, model_id: str | None) -> None:
    """Refuse (:class:`~teibatch.errors.JobSpecError`) a model the job's built-in local servers cannot run;
    any model passes where real TEI serves it (another provider, or Docker's TEI image)."""
    if servers.provider == "local" and local_engine(servers, model_id) == "builtin":
        check_model(model_id, servers.server_args)


def local_engine(servers: ServersSection, model_id: str | None) -> str:
    """``builtin`` or ``docker``: ``auto`` means Docker when an engine answers and TEI can serve the model."""
    engine = servers.engine
    if engine != "auto":
        return engine
    model = model_id or ""
    if not model or model.startswith(BUILTIN_MODEL_PREFIX):
        return "builtin"
    return "docker" if docker_engine_available() else "builtin"


def _startup_timeout(servers: ServersSection) -> float:
    """``servers.startup_timeout``, or 15 minutes for launched containers (image pull, download)."""
    if "startup_timeout" in servers.model_fields_set:
        return servers.startup_timeout
    return DEFAULT_STARTUP_TIMEOUT_S


def ssh_hosts(servers: ServersSection) -> list[SshHost]:
    """The hosts of ``servers.hosts`` and of the ``servers.inventory`` file, validated by the job's rules."""
    return [SshHost(**section.model_dump()) for section in servers.host_sections()]


def _needs_model(model_id: str | None) -> None:
    if not model_id:
        raise JobSpecError("TEI containers need the model to serve: set model.id (a Hugging Face model id)",
                           key="model.id")


def _ssh_provider(servers: ServersSection, model_id: str | None, payload_limit: int | None, export_to: str | None,
                  waive_export: bool) -> SshProvider:
    _needs_model(model_id)
    hosts = ssh_hosts(servers)
    destroys = servers.remove_volume or any(h.destroy_command for h in hosts)
    if destroys and not export_to and not waive_export:
        raise JobSpecError("the job destroys volumes or hosts (servers.remove_volume or a destroy_command) but "
                           "says nowhere to copy the volumes first: set export.to, or export.waive: true",
                           key="export")
    return SshProvider(hosts, model_id=model_id, image=servers.image, volume=servers.volume or DEFAULT_VOLUME,
                       remove_volume=servers.remove_volume, server_args=tuple(servers.server_args),
                       startup_timeout=_startup_timeout(servers), payload_limit=payload_limit)


def gpu_want(servers: ServersSection) -> GpuWant:
    """The cards a cloud job may rent (``servers.gpu``, ``min_vram_gb``, ``max_price``, ``regions``)."""
    return GpuWant(names=servers.gpu, min_vram_gb=servers.min_vram_gb, max_price=servers.max_price,
                   regions=servers.regions)


def cloud_api(servers: ServersSection, capacity: Capacity | None = None) -> LambdaApi | RunPodApi | VastApi:
    """The API of the job's GPU cloud, with the key from the environment or the cloud's config file; on Vast,
    searching the offers of ``capacity`` (default: ``servers.capacity``)."""
    if servers.provider == "lambda":
        return LambdaApi()
    if servers.provider == "vast":
        return VastApi(want=gpu_want(servers), capacity=capacity or servers.capacity,
                       disk_gb=servers.container_disk_gb,
                       min_reliability=DEFAULT_MIN_RELIABILITY if servers.min_reliability is None
                       else servers.min_reliability)
    return RunPodApi(cloud_type=servers.cloud_type)


def _lambda_provider(servers: ServersSection, model_id: str | None, payload_limit: int | None,
                     export_to: str | None, waive_export: bool) -> LambdaProvider:
    _needs_model(model_id)
    if not export_to and not waive_export:
        raise JobSpecError("terminating a Lambda instance destroys its disk (the model weights): set export.to to "
                           "copy the volume off first, or export.waive: true", key="export")
    assert servers.ssh_key_name is not None  # the job file's validation requires it
    return LambdaProvider(LambdaApi(), count=servers.count, want=gpu_want(servers), ssh_key_name=servers.ssh_key_name,
                          login=SshLogin(user=servers.ssh_user, port=servers.ssh_port, key_file=servers.key_file),
                          max_replacements=servers.max_replacements, model_id=model_id, image=servers.image,
                          volume=servers.volume or DEFAULT_VOLUME, remove_volume=servers.remove_volume,
                          server_args=tuple(servers.server_args), startup_timeout=_startup_timeout(servers),
                          payload_limit=payload_limit)


def _runpod_provider(servers: ServersSection, model_id: str | None, payload_limit: int | None,
                     export_to: str | None, waive_export: bool) -> RunPodProvider:
    _needs_model(model_id)
    if export_to:
        raise JobSpecError("a RunPod pod has no shell to copy its volume through: keep the model weights in a "
                           "network volume (servers.network_volume_id) and remove export.to", key="export.to")
    if not servers.network_volume_id and not waive_export:
        raise JobSpecError("terminating a RunPod pod destroys its container disk (the model weights): set "
                           "servers.network_volume_id to keep them in a network volume, or export.waive: true",
                           key="export")
    return RunPodProvider(RunPodApi(cloud_type=servers.cloud_type), count=servers.count, want=gpu_want(servers),
                          model_id=model_id, image=servers.image, server_args=tuple(servers.server_args),
                          startup_timeout=_startup_timeout(servers), max_replacements=servers.max_replacements,
                          network_volume_id=servers.network_volume_id, container_disk_gb=servers.container_disk_gb,
                          payload_limit=payload_limit, capacity=servers.capacity)


def _vast_provider(servers: ServersSection, model_id: str | None, payload_limit: int | None,
                   export_to: str | None, waive_export: bool, import_from: str | None) -> VastProvider:
    _needs_model(model_id)
    if not export_to and not waive_export:
        raise JobSpecError("destroying a Vast instance destroys its disk (the model weights): set export.to (and "
                           "servers.key_file) to copy them off over SSH first, or export.waive: true", key="export")
    login = None
    if export_to or import_from:
        if not servers.key_file:
            what, instead = (("export.to on provider vast copies the model directory off each instance",
                              "export.waive: true without export.to") if export_to else
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
    api = cloud_api(servers)
    assert isinstance(api, VastApi)
    return VastProvider(api, count=servers.count, want=gpu_want(servers), model_id=model_id, image=servers.image,
                        server_args=tuple(servers.server_args), startup_timeout=_startup_timeout(servers),
                        max_replacements=servers.max_replacements, disk_gb=servers.container_disk_gb,
                        payload_limit=payload_limit, capacity=servers.capacity, login=login,
                        model_dir=servers.volume or VAST_MODEL_DIR)
