"""Running commands on a host: this machine (:class:`LocalShell`) or one reached by OpenSSH (:class:`SshShell`).

This is the one place where SSH failures become teibatch errors: exit status 255 is SSH's own
(:class:`HostKeyRejected` or :class:`HostUnreachable`), any other non-zero status is the remote
command's (:class:`RemoteCommandFailed`), a command past its deadline is :class:`FleetTimeout`.
Output quoted in errors has every registered secret replaced by ``***``. OpenSSH reads the key file;
teibatch never opens it. Every child process gets its own session (a Ctrl-C on the terminal does not
cut a teardown command short) and dies with the driver.
"""

from __future__ import annotations

import contextlib
import ctypes
import shlex
import signal
import socket
import subprocess
import tempfile
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from teibatch.errors import FleetError, FleetTimeout, HostKeyRejected, HostUnreachable, RemoteCommandFailed
from teibatch.fleet.ledger import state_dir

DEFAULT_COMMAND_TIMEOUT_S = 60.0
LOGIN_RETRY_S = 2.0
CONNECT_TIMEOUT_S = 15
TUNNEL_POLL_S = 0.1
SSH_FAILED = 255
_PR_SET_PDEATHSIG = 1
_HOST_KEY_PROBLEMS = (b"Host key verification failed", b"REMOTE HOST IDENTIFICATION HAS CHANGED",
                      b"No ED25519 host key is known", b"host key for")


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM this child when the driver dies, even by SIGKILL."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def redact(text: str, secrets: list[str]) -> str:
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


@dataclass(frozen=True)
class CommandResult:
    status: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")


class Shell(ABC):
    """Runs shell command lines on one host."""

    label: str

    def __init__(self) -> None:
        self.secrets: list[str] = []

    @abstractmethod
    def argv(self, command: str) -> list[str]:
        """The local argv that runs ``command`` on the host."""

    @abstractmethod
    def record(self) -> dict[str, Any]:
        """How to reach this host again (for the ledger); no secret."""

    @abstractmethod
    def reach(self, port: int, deadline: float) -> tuple[str, Tunnel | None]:
        """A URL on this machine for the host's loopback ``port`` (and the tunnel that carries it)."""

    def _failed(self, status: int, stderr: bytes, what: str) -> Exception:
        tail = redact(stderr.decode(errors="replace").strip()[-600:], self.secrets)
        return RemoteCommandFailed(f"{what} failed (exit status {status}): {tail or '(no output)'}",
                                   host=self.label, exit_status=status)

    def run(self, command: str, *, what: str, input: bytes | None = None,
            timeout: float = DEFAULT_COMMAND_TIMEOUT_S, check: bool = True) -> CommandResult:
        """Run ``command``; raise a mapped error on failure (unless ``check`` is false) or after ``timeout``."""
        try:
            done = subprocess.run(self.argv(command), input=input if input is not None else b"",
                                  capture_output=True, timeout=timeout, start_new_session=True,
                                  preexec_fn=die_with_parent)
        except subprocess.TimeoutExpired:
            raise FleetTimeout(f"{self.label}: {what} did not finish within {timeout:.0f}s",
                               what=what, seconds=timeout) from None
        except OSError as exc:
            raise HostUnreachable(f"cannot start {self.argv('')[0]}: {exc.strerror}", host=self.label) from exc
        result = CommandResult(done.returncode, done.stdout, done.stderr)
        if check and result.status != 0:
            raise self._failed(result.status, result.stderr, what)
        return result

    @contextlib.contextmanager
    def stream(self, command: str, *, what: str, timeout: float, stdin: bool = False) -> Iterator[IO[bytes]]:
        """Run ``command`` with its stdout (or, with ``stdin``, its stdin) as a pipe for the block.

        The process is killed once ``timeout`` passes; the block's end waits for it and raises the
        mapped error if it failed.
        """
        with tempfile.TemporaryFile() as errors:
            try:
                process = subprocess.Popen(self.argv(command), stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                                           stdout=subprocess.DEVNULL if stdin else subprocess.PIPE, stderr=errors,
                                           start_new_session=True, preexec_fn=die_with_parent)
            except OSError as exc:
                raise HostUnreachable(f"cannot start {self.argv('')[0]}: {exc.strerror}", host=self.label) from exc
            timed_out = threading.Event()

            def kill() -> None:
                timed_out.set()
                process.kill()

            timer = threading.Timer(timeout, kill)
            timer.start()
            pipe = process.stdin if stdin else process.stdout
            assert pipe is not None
            try:
                yield pipe
                pipe.close()
                process.wait(timeout=max(1.0, timeout))
            finally:
                timer.cancel()
                if process.poll() is None:
                    process.kill()
                    process.wait()
                pipe.close()
            if timed_out.is_set():
                raise FleetTimeout(f"{self.label}: {what} did not finish within {timeout:.0f}s",
                                   what=what, seconds=timeout)
            if process.returncode != 0:
                errors.seek(0)
                raise self._failed(process.returncode, errors.read(), what)


class LocalShell(Shell):
    """This machine, through ``sh -c`` (the ``local`` provider's Docker engine)."""

    label = "local"

    def argv(self, command: str) -> list[str]:
        return ["sh", "-c", command]

    def record(self) -> dict[str, Any]:
        return {"kind": "local"}

    def reach(self, port: int, deadline: float) -> tuple[str, Tunnel | None]:
        return f"http://127.0.0.1:{port}", None


@dataclass(frozen=True)
class SshTarget:
    """How to reach one host with OpenSSH; the key file is a path, never its contents."""

    address: str
    port: int = 22
    user: str | None = None
    key_file: str | None = None
    jump_host: str | None = None          # [user@]host[:port], reached with the same key and known_hosts
    known_hosts: str | None = None        # default: OpenSSH's own (~/.ssh/known_hosts)
    host_key_checking: str = "yes"        # yes | accept-new

    @property
    def label(self) -> str:
        return f"{self.user + '@' if self.user else ''}{self.address}:{self.port}"

    def options(self) -> list[str]:
        options = ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={CONNECT_TIMEOUT_S}",
                   "-o", "ServerAliveInterval=15", "-o", "ServerAliveCountMax=4", "-o", "LogLevel=ERROR",
                   "-o", f"StrictHostKeyChecking={self.host_key_checking}"]
        if self.known_hosts:
            options += ["-o", f"UserKnownHostsFile={self.known_hosts}"]
        if self.key_file:
            options += ["-i", self.key_file, "-o", "IdentitiesOnly=yes"]
        return options

    def argv(self, *extra: str) -> list[str]:
        argv = ["ssh", *self.options(), "-p", str(self.port)]
        if self.jump_host:
            jump = SshTarget.parse(self.jump_host, like=self)
            proxy = [*jump.argv("-W", "%h:%p")]
            argv += ["-o", "ProxyCommand=" + shlex.join(proxy)]
        return [*argv, *extra, f"{self.user}@{self.address}" if self.user else self.address]

    @classmethod
    def parse(cls, text: str, *, like: SshTarget) -> SshTarget:
        """``[user@]host[:port]`` with ``like``'s key and host-key settings."""
        user, _, rest = text.rpartition("@")
        host, _, port = rest.partition(":")
        return cls(address=host, port=int(port or 22), user=user or like.user, key_file=like.key_file,
                   known_hosts=like.known_hosts, host_key_checking=like.host_key_checking)


@dataclass(frozen=True)
class SshLogin:
    """How teibatch logs in to a rented VM (``lambda``, and ``vast`` for its exports); the defaults are Lambda's
    images (``ubuntu``, port 22, the key registered as ``ssh_key_name``); ``key_file`` is a path OpenSSH reads,
    never read by teibatch."""

    user: str = "ubuntu"
    port: int = 22
    key_file: str | None = None

    def target(self, address: str, run_id: str) -> SshTarget:
        # A freshly rented VM has a host key nobody knows yet: accept it into this run's own known_hosts.
        known_hosts = state_dir() / "known_hosts" / run_id
        known_hosts.parent.mkdir(parents=True, exist_ok=True)
        return SshTarget(address=address, port=self.port, user=self.user,
                         key_file=str(Path(self.key_file).expanduser()) if self.key_file else None,
                         known_hosts=str(known_hosts), host_key_checking="accept-new")


class SshShell(Shell):
    """A host reached with the OpenSSH client; its loopback ports through ``ssh -L`` tunnels."""

    def __init__(self, target: SshTarget) -> None:
        super().__init__()
        self.target = target
        self.label = target.label

    def argv(self, command: str) -> list[str]:
        # Through `sh -c`, whatever the login shell of the remote user is.
        return [*self.target.argv(), "--", f"sh -c {shlex.quote(command)}"] if command else self.target.argv()

    def record(self) -> dict[str, Any]:
        return {"kind": "ssh", **asdict(self.target)}

    def _failed(self, status: int, stderr: bytes, what: str) -> Exception:
        if status == SSH_FAILED:
            tail = redact(stderr.decode(errors="replace").strip()[-400:], self.secrets)
            if any(problem in stderr for problem in _HOST_KEY_PROBLEMS):
                return HostKeyRejected(f"{what}: the host key is not trusted ({tail})", host=self.label,
                                       exit_status=status)
            return HostUnreachable(f"{what}: ssh could not connect or log in: {tail or '(no output)'}",
                                   host=self.label, exit_status=status)
        return super()._failed(status, stderr, what)

    def reach(self, port: int, deadline: float) -> tuple[str, Tunnel]:
        tunnel = Tunnel.open(self, port, deadline)
        return f"http://127.0.0.1:{tunnel.local_port}", tunnel


class Tunnel:
    """``ssh -N -L 127.0.0.1:<local>:127.0.0.1:<remote>``: a host's loopback port on this machine's."""

    def __init__(self, process: subprocess.Popen[bytes], local_port: int) -> None:
        self.process = process
        self.local_port = local_port

    @classmethod
    def open(cls, shell: SshShell, remote_port: int, deadline: float, attempts: int = 3) -> Tunnel:
        """Open a tunnel and wait (until ``deadline``) for its local port to accept connections.

        A local port taken between choosing and binding it is retried with another one.
        """
        stderr = b""
        for _ in range(attempts):
            local_port = free_port()
            forward = f"127.0.0.1:{local_port}:127.0.0.1:{remote_port}"
            argv = shell.target.argv("-N", "-o", "ExitOnForwardFailure=yes", "-L", forward)
            with tempfile.TemporaryFile() as errors:
                process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                           stderr=errors, start_new_session=True, preexec_fn=die_with_parent)
                while time.monotonic() < deadline and process.poll() is None:
                    with socket.socket() as probe:
                        probe.settimeout(0.5)
                        if probe.connect_ex(("127.0.0.1", local_port)) == 0:
                            return cls(process, local_port)
                    time.sleep(TUNNEL_POLL_S)
                if process.poll() is None:
                    process.kill()
                    process.wait()
                    raise FleetTimeout(f"{shell.label}: the SSH tunnel did not open before the deadline",
                                       what="tunnel", seconds=0.0)
                errors.seek(0)
                stderr = errors.read()
            if b"forwarding" not in stderr.lower():  # not a port clash: SSH itself failed
                break
        raise shell._failed(SSH_FAILED, stderr, "the SSH tunnel")

    def alive(self) -> bool:
        return self.process.poll() is None

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def wait_login(shell: Shell, deadline: float) -> None:
    """Wait until ``shell`` takes a login (a rented machine's sshd starts a little after its cloud says it
    runs, and a key attached to it takes a moment to apply); raise the last failure at ``deadline``
    (monotonic). A rejected host key is raised at once: waiting does not fix it."""
    while True:
        try:
            shell.run("true", what="ssh login", timeout=max(1.0, min(20.0, deadline - time.monotonic())))
            return
        except HostKeyRejected:
            raise
        except FleetError:
            if time.monotonic() + LOGIN_RETRY_S >= deadline:
                raise
            time.sleep(LOGIN_RETRY_S)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def shell_from_record(record: dict[str, Any]) -> Shell:
    """The shell a ledger record describes (see :meth:`Shell.record`)."""
    fields = {k: v for k, v in record.items() if k != "kind"}
    return SshShell(SshTarget(**fields)) if record.get("kind") == "ssh" else LocalShell()
