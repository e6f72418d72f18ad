"""From the job file's ``servers`` section to a fleet provider."""

from __future__ import annotations

import os

from teibatch.errors import JobSpecError
from teibatch.fleet import LocalProvider, Provider, StaticProvider
from teibatch.job import JobSpec


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
        return StaticProvider(list(servers.urls), api_key=api_key_from_env(job),
                              startup_timeout=servers.startup_timeout, payload_limit=payload_limit)
    return LocalProvider(servers.count, model_id=job.model.id, server_args=list(servers.server_args),
                         startup_timeout=servers.startup_timeout, payload_limit=payload_limit)
