"""The SSH boundary: commands, error mapping, jump hosts, tunnels, against a real sshd."""

from __future__ import annotations

import time

import httpx
import pytest

from teibatch.errors import FleetTimeout, HostKeyRejected, HostUnreachable, RemoteCommandFailed
from teibatch.fleet.shell import LocalShell, SshShell, free_port, shell_from_record
from tests.fleet.conftest import SshHostFixture


def test_runs_commands_with_the_standins_first_on_path(host: SshHostFixture) -> None:
    shell = SshShell(host.target())
    result = shell.run("command -v docker; echo $STANDIN_STATE; cat", what="probe", input=b"from stdin")
    lines = result.text.splitlines()
    assert lines[0] == str(host.workdir / "bin" / "docker")
    assert lines[1] == str(host.standin.root)
    assert lines[2] == "from stdin"
    assert shell_from_record(shell.record()).argv("x") == shell.argv("x")


def test_remote_failure_is_mapped_and_redacted(host: SshHostFixture) -> None:
    shell = SshShell(host.target())
    shell.secrets.append("s3cret-value")
    with pytest.raises(RemoteCommandFailed) as caught:
        shell.run("echo 'bad s3cret-value' >&2; exit 3", what="a step")
    assert caught.value.exit_status == 3
    assert "s3cret-value" not in str(caught.value) and "***" in str(caught.value)


@pytest.mark.parametrize("overrides, error", [
    pytest.param({"host_key_checking": "yes"}, HostKeyRejected, id="unknown-host-key-strict"),
    pytest.param({"port": None}, HostUnreachable, id="nothing-listening"),
])
def test_ssh_failures_are_mapped(host: SshHostFixture, overrides: dict, error: type) -> None:
    if overrides.get("port", 1) is None:
        overrides["port"] = free_port()
    shell = SshShell(host.target(**overrides))
    with pytest.raises(error) as caught:
        shell.run("true", what="probe")
    assert caught.value.exit_status == 255
    assert caught.value.host == shell.label


def test_jump_host_uses_the_same_key(host: SshHostFixture) -> None:
    jump = f"{host.user}@127.0.0.1:{host.port}"
    shell = SshShell(host.target(jump_host=jump))
    assert shell.run("echo through", what="probe").text.strip() == "through"


def test_tunnel_reaches_a_loopback_port_and_closes(host: SshHostFixture) -> None:
    from teibatch.server.testing import running_server

    with running_server() as url:
        port = int(url.rsplit(":", 1)[1])
        shell = SshShell(host.target())
        local_url, tunnel = shell.reach(port, time.monotonic() + 10)
        try:
            assert httpx.get(f"{local_url}/health", timeout=5).status_code == 200
        finally:
            tunnel.close()
        assert not tunnel.alive()


def test_command_past_its_deadline_is_a_typed_timeout() -> None:
    with pytest.raises(FleetTimeout) as caught:
        LocalShell().run("sleep 5", what="a slow step", timeout=0.3)
    assert caught.value.what == "a slow step"
