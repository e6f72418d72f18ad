"""Fixtures for the fleet: a real sshd on 127.0.0.1 with stand-in ``docker`` and ``nvidia-smi`` on its PATH.

Each test that asks for ``host`` gets its own sshd (a free port, a generated host key, an authorized
client key, strict modes off, everything under the test's temp dir) and its own stand-in state; the
sshd is stopped and every stand-in container killed when the test ends. Without ``/usr/sbin/sshd``
these tests are skipped (install ``openssh-server``), or fail when ``TEIBATCH_REQUIRE_SSHD`` is set.
"""

from __future__ import annotations

import contextlib
import getpass
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from teibatch.fleet.ledger import Ledger
from teibatch.fleet.shell import SshTarget

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
STANDIN = Path(__file__).with_name("standin_docker.py")
START_DEADLINE_S = 10.0


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def install_standins(directory: Path) -> Path:
    """Write ``docker`` and ``nvidia-smi`` into ``directory/bin``, run by this Python."""
    bin_dir = directory / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    source = STANDIN.read_text()
    for tool in ("docker", "nvidia-smi"):
        path = bin_dir / tool
        path.write_text(f"#!{sys.executable}\n{source}")
        path.chmod(0o755)
    return bin_dir


@dataclass
class StandinState:
    """What the stand-in ``docker`` recorded: calls, containers, downloads."""

    root: Path

    def configure(self, **settings: Any) -> None:
        config = self.config()
        config.update(settings)
        self.root.mkdir(parents=True, exist_ok=True)
        (self.root / "config.json").write_text(json.dumps(config))

    def config(self) -> dict[str, Any]:
        path = self.root / "config.json"
        return json.loads(path.read_text()) if path.exists() else {}

    def calls(self, tool: str = "docker") -> list[list[str]]:
        path = self.root / "calls.jsonl"
        if not path.exists():
            return []
        lines = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [line["argv"] for line in lines if line["tool"] == tool]

    def runs(self) -> list[list[str]]:
        return [argv for argv in self.calls() if argv and argv[0] == "run"]

    def containers(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted((self.root / "containers").glob("*.json"))]

    def running(self) -> int:
        """Containers whose server process is alive: the count every fault test ends with."""
        return sum(1 for c in self.containers() if _alive(c["pid"]))

    def downloads(self) -> list[dict[str, Any]]:
        path = self.root / "downloads.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    def api_key(self) -> str | None:
        path = self.root / "witness" / "api_key"
        return path.read_text() if path.exists() else None

    def wait_running(self, count: int, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.running() == count:
                return True
            time.sleep(0.1)
        return self.running() == count

    def kill(self, name: str) -> None:
        """What terminating a rented VM does to its containers: they are gone."""
        for container in self.containers():
            if container["name"] == name:
                if _alive(container["pid"]):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(container["pid"], signal.SIGKILL)
                (self.root / "containers" / f"{name}.json").unlink(missing_ok=True)

    def kill_all(self) -> None:
        for container in self.containers():
            if _alive(container["pid"]):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(container["pid"], signal.SIGKILL)


@dataclass
class SshHostFixture:
    """A running sshd and how to reach it."""

    port: int
    user: str
    key_file: Path
    known_hosts: Path
    standin: StandinState
    workdir: Path

    def host(self, **overrides: Any) -> dict[str, Any]:
        """A ``servers.hosts`` entry for this sshd."""
        entry = {"address": "127.0.0.1", "port": self.port, "user": self.user, "key_file": str(self.key_file),
                 "known_hosts": str(self.known_hosts), "host_key_checking": "accept-new"}
        entry.update(overrides)
        return entry

    def target(self, **overrides: Any) -> SshTarget:
        return SshTarget(**self.host(**overrides))


@pytest.fixture(scope="session")
def client_key(tmp_path_factory: pytest.TempPathFactory) -> Path:
    if not os.path.exists(SSHD):
        if os.environ.get("TEIBATCH_REQUIRE_SSHD"):  # CI sets it: a skip there would hide the ssh tests
            pytest.fail("sshd not installed (apt-get install -y openssh-server) and TEIBATCH_REQUIRE_SSHD is set")
        pytest.skip("sshd not installed (apt-get install -y openssh-server)")
    directory = tmp_path_factory.mktemp("client-key")
    key = directory / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "teibatch-test", "-f", str(key)],
                   check=True, timeout=30)
    return key


@pytest.fixture
def host(tmp_path: Path, client_key: Path) -> Iterator[SshHostFixture]:
    """An sshd on 127.0.0.1 for this test, with the stand-ins first on its sessions' PATH."""
    workdir = tmp_path / "sshd"
    workdir.mkdir()
    host_key = workdir / "host_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True, timeout=30)
    authorized = workdir / "authorized_keys"
    authorized.write_text(client_key.with_suffix(".pub").read_text())
    bin_dir = install_standins(workdir)
    state = StandinState(workdir / "standin")
    state.configure()
    port = _free_port()
    config = workdir / "sshd_config"
    config.write_text("\n".join([
        f"Port {port}", "ListenAddress 127.0.0.1", f"HostKey {host_key}", f"PidFile {workdir / 'sshd.pid'}",
        f"AuthorizedKeysFile {authorized}", "StrictModes no", "PasswordAuthentication no",
        "KbdInteractiveAuthentication no", "PubkeyAuthentication yes", "PermitRootLogin prohibit-password",
        "UsePAM no", "AllowTcpForwarding yes", "Subsystem sftp internal-sftp", "LogLevel ERROR",
        f"SetEnv PATH={bin_dir}:/usr/local/bin:/usr/bin:/bin STANDIN_STATE={state.root}", ""]))
    with contextlib.suppress(OSError):  # sshd wants its privilege separation dir (root only)
        os.makedirs("/run/sshd", exist_ok=True)
    log = open(workdir / "sshd.log", "wb")  # noqa: SIM115 - closed below
    daemon = subprocess.Popen([SSHD, "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                              stdin=subprocess.DEVNULL)
    deadline = time.monotonic() + START_DEADLINE_S
    while time.monotonic() < deadline and daemon.poll() is None:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.05)
    else:
        daemon.kill()
        pytest.fail(f"sshd did not start: {(workdir / 'sshd.log').read_text()}")
    fixture = SshHostFixture(port=port, user=getpass.getuser(), key_file=client_key,
                             known_hosts=workdir / "known_hosts", standin=state, workdir=workdir)
    try:
        yield fixture
    finally:
        state.kill_all()
        daemon.terminate()
        try:
            daemon.wait(timeout=10)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        log.close()


@pytest.fixture
def ledger(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Ledger:
    """The ledger of this test (``TEIBATCH_STATE_DIR`` points into its temp dir)."""
    monkeypatch.setenv("TEIBATCH_STATE_DIR", str(tmp_path / "state"))
    return Ledger(tmp_path / "state" / "ledger")


LAMBDA_KEY = "lambda-test-key-" + "9" * 24
RUNPOD_KEY = "runpod-test-key-" + "7" * 24
VAST_KEY = "vast-test-key-" + "5" * 26


@pytest.fixture
def fast_polls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Poll the fake clouds every 0.1 s instead of every 2 s (and look for lost instances every 0.2 s, not 10 s);
    no request pacing (the fakes enforce no rate unless a test sets one)."""
    from teibatch.fleet import cloudapi, rental, shell

    monkeypatch.setattr(cloudapi.ApiClient, "pace_scale", 0.0)

    monkeypatch.setattr(rental, "POLL_S", 0.1)
    monkeypatch.setattr(rental, "WATCH_S", 0.2)
    monkeypatch.setattr(shell, "LOGIN_RETRY_S", 0.2)


@contextlib.contextmanager
def lambda_client(monkeypatch: pytest.MonkeyPatch, timeout_s: float) -> Iterator[tuple[Any, Any]]:
    """The fake Lambda Cloud (no host behind its instances) and a ``LambdaApi`` of it whose calls time out
    after ``timeout_s``: for tests of the API client and the rental machinery themselves."""
    from teibatch.fleet.providers.lambdacloud import LambdaApi
    from tests.fleet.fake_lambda import FakeLambda

    monkeypatch.setenv("LAMBDA_API_KEY", LAMBDA_KEY)
    with FakeLambda(LAMBDA_KEY) as fake:
        monkeypatch.setenv("TEIBATCH_LAMBDA_API_URL", f"{fake.url}/api/v1")
        api = LambdaApi(timeout=timeout_s)
        try:
            yield fake, api
        finally:
            api.close()


@pytest.fixture
def fake_lambda(host: SshHostFixture, monkeypatch: pytest.MonkeyPatch, fast_polls: None) -> Iterator[Any]:
    """A fake Lambda Cloud API on 127.0.0.1 whose instances are ``host`` (the test sshd); the key and the
    API address in the environment, as a run reads them."""
    from tests.fleet.fake_lambda import FakeLambda

    fake = FakeLambda(LAMBDA_KEY, on_terminate=host.standin.kill)
    host.standin.configure(gpu="NVIDIA A10, 8.6, 23028 MiB")  # the card the jobs rent
    monkeypatch.setenv("LAMBDA_API_KEY", LAMBDA_KEY)
    monkeypatch.setenv("TEIBATCH_LAMBDA_API_URL", f"{fake.url}/api/v1")
    with fake:
        yield fake


@pytest.fixture
def fake_runpod(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_polls: None) -> Iterator[Any]:
    """A fake RunPod (API v2) on 127.0.0.1 whose pods are ``teibatch serve`` processes; key and address in the
    environment. It checks every request against RunPod's OpenAPI file (skipped, with the reason, without
    it), and every answer it sent must have kept to the file too."""
    from tests.fleet.cloudspec import load_spec
    from tests.fleet.fake_runpod import SPEC_FILE, FakeRunPod

    spec = load_spec(SPEC_FILE)
    workdir = tmp_path / "runpod"
    workdir.mkdir()
    fake = FakeRunPod(RUNPOD_KEY, workdir, spec)
    monkeypatch.setenv("RUNPOD_API_KEY", RUNPOD_KEY)
    monkeypatch.setenv("TEIBATCH_RUNPOD_API_URL", fake.rest_url)
    with fake:
        yield fake
    assert fake.answer_problems == [], "the fake answered outside RunPod's spec"


@pytest.fixture
def fake_vast(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fast_polls: None) -> Iterator[Any]:
    """A fake Vast.ai on 127.0.0.1 whose instances are ``teibatch serve`` processes; key and address in the
    environment. It checks every request against Vast's OpenAPI file (skipped, with the reason, without
    it), and every answer it sent must have kept to the file too."""
    from tests.fleet.cloudspec import load_spec
    from tests.fleet.fake_vast import SPEC_FILE, FakeVast

    spec = load_spec(SPEC_FILE)
    workdir = tmp_path / "vast"
    workdir.mkdir()
    fake = FakeVast(VAST_KEY, workdir, spec)
    monkeypatch.setenv("VAST_API_KEY", VAST_KEY)
    monkeypatch.setenv("TEIBATCH_VAST_API_URL", fake.api_url)
    with fake:
        yield fake
    assert fake.answer_problems == [], "the fake answered outside Vast's spec"


def kill_when_ready(command: list[str], env: dict[str, str], wait_s: float = 90.0) -> None:
    """Run a driver ``command`` until it prints ``ready``, then SIGKILL it (no cleanup of any kind)."""
    driver = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert driver.stdout is not None
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline and driver.stdout.readline().strip() != b"ready":
            assert driver.poll() is None, driver.stderr.read().decode() if driver.stderr else ""
        driver.kill()
        driver.wait(timeout=30)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def sweep_destroys_what_the_killed_run_left(alive: Callable[[], int], instance: str) -> None:
    """``fleet list`` shows ``instance`` from the ledger and from the cloud; ``fleet sweep`` destroys it."""
    from click.testing import CliRunner

    from teibatch.cli_fleet import fleet
    from teibatch.fleet.clouds import run_of

    runner = CliRunner()
    listed = json.loads(runner.invoke(fleet, ["list", "--json"]).stdout)
    assert {(e.get("source", "ledger"), e["instance"]) for e in listed} == {("ledger", instance), ("cloud", instance)}
    swept = runner.invoke(fleet, ["sweep"])
    assert swept.exit_code == 0, swept.output
    assert f"{run_of(instance)}: destroyed" in swept.output
    assert alive() == 0
    assert runner.invoke(fleet, ["list"]).output.strip() == "nothing left running"


def first_commit(out: Path) -> bool:
    """Whether the output at ``out`` has committed a shard yet."""
    try:
        return bool(json.loads((out / "_manifest.json").read_text()).get("shards"))
    except (OSError, ValueError):
        return False


def signal_after_first_commit(job: Path, cwd: Path, env: dict[str, str], signum: int,
                              before_signal: Callable[[], None], wait_s: float = 90.0) -> tuple[int, bytes]:
    """Run ``teibatch run --quiet job``; once a shard is committed, call ``before_signal`` and send ``signum``.

    Returns the driver's exit code and standard error; the driver never outlives the call.
    """
    driver = subprocess.Popen([sys.executable, "-m", "teibatch", "run", "--quiet", str(job)], cwd=cwd, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + wait_s
        while not first_commit(cwd / "out"):
            assert driver.poll() is None, driver.stderr.read().decode()[-2000:] if driver.stderr else ""
            assert time.monotonic() < deadline, "no shard committed in time"
            time.sleep(0.2)
        before_signal()
        driver.send_signal(signum)
        _, stderr = driver.communicate(timeout=wait_s)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    return driver.returncode, stderr
