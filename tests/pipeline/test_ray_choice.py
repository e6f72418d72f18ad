"""Ray is chosen, never stumbled into: a private local Ray by default, a clear error for one that cannot be joined."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
from pathlib import Path

import orjson
import psutil
import pyarrow.dataset as ds
import pytest
import yaml

from teibatch.pipeline.shard import SHARD_TASK_NICENESS
from tests.conftest import write_jsonl
from tests.pipeline.conftest import free_port, plain_env

pytestmark = pytest.mark.slow  # every test starts drivers, Ray or pytest in processes of their own


def small_job(tmp_path: Path) -> tuple[Path, Path]:
    write_jsonl(tmp_path / "c" / "docs.jsonl", [{"id": f"d{i}", "text": f"text {i}"} for i in range(30)])
    out = tmp_path / "out"
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"corpus": {"path": str(tmp_path / "c"), "id_field": "id"},
                                   "servers": {"provider": "local", "count": 1}, "output": {"path": str(out)}}))
    return job, out


def teibatch(*args: str, env: dict[str, str], timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "teibatch", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.timeout(300)
def test_a_plain_run_starts_its_own_ray_whatever_runs_on_the_machine(tmp_path: Path, ambient_cluster: str) -> None:
    job, out = small_job(tmp_path)
    done = teibatch("run", str(job), env=plain_env())
    assert done.returncode == 0, done.stderr
    assert sorted(ds.dataset(out / "vectors").to_table().column("id").to_pylist()) == sorted(
        f"d{i}" for i in range(30))
    # A normal run prints no Ray notice (token authentication, dashboards, usage statistics).
    assert "Ray" not in done.stderr and "ray" not in done.stderr.replace("ray-address", ""), done.stderr


@pytest.mark.timeout(120)
def test_an_unreachable_ray_address_is_one_line_exit_1_and_a_failed_report(tmp_path: Path) -> None:
    job, out = small_job(tmp_path)
    address = f"127.0.0.1:{free_port()}"  # nothing listens there
    started = time.monotonic()
    done = teibatch("run", str(job), "--ray-address", address, env=plain_env(), timeout=100)
    assert done.returncode == 1
    assert time.monotonic() - started < 60
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: could not join the Ray cluster at"), done.stderr
    assert "--ray-address" in lines[0] and "Traceback" not in done.stderr
    (report,) = (out / "runs").iterdir()
    assert orjson.loads(report.read_bytes())["status"] == "failed"


@pytest.mark.timeout(300)
def test_the_suite_ignores_ray_address_and_ambient_clusters(ambient_cluster: str) -> None:
    # The suite's own Ray fixture and runs stay private even when the environment points elsewhere.
    env = {**plain_env(), "RAY_ADDRESS": ambient_cluster}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           "tests/pipeline/test_run.py::test_local_run_writes_one_row_per_document"],
                          env=env, capture_output=True, text=True, timeout=280, check=False,
                          cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0, done.stdout[-3000:]


@pytest.mark.timeout(300)
def test_a_private_ray_starts_only_what_a_run_uses_and_leaves_nothing_behind(tmp_path: Path) -> None:
    job, out = small_job(tmp_path)
    driver = subprocess.Popen([sys.executable, "-m", "teibatch", "run", str(job)], env=plain_env(),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    # A forked child shows its parent's command line until it execs, so every line a pid shows is kept.
    seen: dict[int, set[str]] = {}
    niceness: dict[str, set[int]] = {}  # a Ray worker's title (what it runs now) -> its niceness then
    deadline = time.monotonic() + 240
    while driver.poll() is None and time.monotonic() < deadline:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(driver.pid).children(recursive=True):
                with contextlib.suppress(psutil.Error):
                    command = " ".join(child.cmdline())
                    seen.setdefault(child.pid, set()).add(command)
                    if command.startswith("ray::"):
                        niceness.setdefault(command.split()[0], set()).add(child.nice())
        time.sleep(0.05)
    _, stderr = driver.communicate(timeout=60)
    assert driver.returncode == 0, stderr
    commands = [command for lines in seen.values() for command in lines]
    assert any("raylet" in c for c in commands) and any("gcs_server" in c for c in commands), commands
    # The dashboard's API server, the autoscaler monitor and the log monitor serve nobody on a private Ray.
    for idle in ("dashboard/dashboard.py", "autoscaler/_private/monitor.py", "_private/log_monitor.py"):
        assert not any(idle in c for c in commands), (idle, commands)
    # Its workers start at niceness 0, not Ray's default of 15: the senders are level with the servers.
    senders = {n for title, values in niceness.items() if title.startswith("ray::SenderActor") for n in values}
    assert senders == {0}, niceness
    report = orjson.loads(next((out / "runs").iterdir()).read_bytes())
    timings = report["timings"]
    assert timings["ray_start_s"] > 0 and 0 <= timings["ray_wait_s"] <= timings["ray_start_s"]
    assert report["ray_background"] > 0  # the CPU of Ray's own processes, its start-up included
    assert ds.dataset(out / "vectors").count_rows() == 30
    # Everything the run started is gone once the command has returned.
    settle = time.monotonic() + 30
    while time.monotonic() < settle and any(psutil.pid_exists(pid) and _alive(pid) for pid in seen):
        time.sleep(0.2)
    assert not [seen[pid] for pid in seen if psutil.pid_exists(pid) and _alive(pid)]


def _alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


@pytest.mark.timeout(120)
def test_on_a_private_ray_shard_tasks_step_down_below_the_senders() -> None:
    script = """
import os, ray
from teibatch.pipeline.ray_runtime import start_local_ray
from teibatch.pipeline.shard import yield_to_senders
start_local_ray(num_cpus=1)

@ray.remote(num_cpus=0)
class Sender:
    def niceness(self):
        return os.getpriority(os.PRIO_PROCESS, 0)

@ray.remote(num_cpus=1)
def shard_task():
    yield_to_senders()
    return os.getpriority(os.PRIO_PROCESS, 0)

print(ray.get(Sender.remote().niceness.remote()), ray.get(shard_task.remote()))
"""
    done = subprocess.run([sys.executable, "-c", script], env=plain_env(), capture_output=True, text=True,
                          timeout=110, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["0", str(SHARD_TASK_NICENESS)]
