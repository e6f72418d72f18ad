"""TEI containers on a host, through its :class:`~teibatch.fleet.shell.Shell`: run, find, remove, logs.

Containers are found by the run label (``teibatch.run=<run id>``), never only by names held in
memory, so a sweep finds what a killed driver launched even if its ledger missed the last step.
"""

from __future__ import annotations

import shlex

from teibatch.errors import RemoteCommandFailed
from teibatch.fleet.images import CONTAINER_PORT, RUN_LABEL, ContainerSpec, docker_run_command
from teibatch.fleet.shell import Shell, redact


def launch(shell: Shell, spec: ContainerSpec, api_key: str, *, timeout: float) -> int:
    """Start ``spec`` (replacing a container of the same name) and return its port on the host's loopback.

    The API key travels on the command's stdin into ``$API_KEY`` of the remote shell, which
    ``docker run -e API_KEY`` passes on: it is on no command line and in no file.
    """
    name = shlex.quote(spec.name)
    command = (f"docker rm -f {name} >/dev/null 2>&1; IFS= read -r API_KEY && export API_KEY && "
               f"{docker_run_command(spec)} >/dev/null && docker port {name} {CONTAINER_PORT}")
    result = shell.run(command, what=f"docker run {spec.name}", input=f"{api_key}\n".encode(), timeout=timeout)
    for line in result.text.splitlines():
        host, _, port = line.strip().rpartition(":")
        if host in ("127.0.0.1", "0.0.0.0") and port.isdigit():
            return int(port)
    raise RemoteCommandFailed(f"docker port {spec.name}: no loopback port in {result.text.strip()!r}",
                              host=shell.label)


def _label(run_id: str) -> str:
    return shlex.quote(f"label={RUN_LABEL}={run_id}")


def list_run(shell: Shell, run_id: str) -> dict[str, str]:
    """The containers of ``run_id`` on the host: name → state (``running``, ``exited``, ...)."""
    result = shell.run(f"docker ps -a --filter {_label(run_id)} --format '{{{{.Names}}}}\t{{{{.State}}}}'",
                       what="docker ps")
    found = {}
    for line in result.text.splitlines():
        name, _, state = line.strip().partition("\t")
        if name:
            found[name] = state or "unknown"
    return found


def remove_run(shell: Shell, run_id: str) -> None:
    """Remove every container of ``run_id`` on the host (idempotent), then check that none is left."""
    label = _label(run_id)
    command = (f"ids=$(docker ps -aq --filter {label}) && {{ [ -z \"$ids\" ] || docker rm -f $ids >/dev/null; }} "
               f"&& docker ps -aq --filter {label}")
    left = shell.run(command, what="docker rm").text.split()
    if left:
        raise RemoteCommandFailed(f"docker rm -f left {len(left)} container(s) of run {run_id}",
                                  host=shell.label)


def logs_tail(shell: Shell, name: str, lines: int = 20) -> str:
    """The end of a container's log (secrets removed), or a note that it could not be read."""
    try:
        result = shell.run(f"docker logs --tail {int(lines)} {shlex.quote(name)} 2>&1", what="docker logs", check=False)
    except Exception as exc:  # a log is only a hint in a message that is already an error
        return f"(log unavailable: {exc})"
    return redact(result.text.strip(), shell.secrets) or "(empty log)"
