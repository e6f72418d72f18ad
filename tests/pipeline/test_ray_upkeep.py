"""A private Ray starts only what a run uses and its background CPU is counted; a joined cluster is left as it is."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.pipeline.conftest import plain_env

pytestmark = pytest.mark.slow  # every test starts Ray in a process of its own

# Starts a private Ray as a run does, lets it settle, and prints what runs under it and what the
# sampler counted over a task: one line of process names, one of figures.
PRIVATE = """
import time, psutil, ray
from teibatch.pipeline.ray_runtime import start_local_ray
from teibatch.pipeline.ray_upkeep import RayUpkeep
start_local_ray(num_cpus=1)
upkeep = RayUpkeep(from_process_start=True)
upkeep.start()
time.sleep(3)  # long enough for Ray to have prestarted its workers, were it to

@ray.remote(num_cpus=1)
def busy():
    import os
    deadline = time.process_time() + 2.5  # over two samples' interval
    while time.process_time() < deadline:
        pass
    return os.getpid()

def process_names():
    children = psutil.Process().children(recursive=True)
    return sorted(" ".join(p.cmdline()).split()[0].rsplit("/", 1)[-1] for p in children)
deadline = time.monotonic() + 60  # on a loaded machine an agent takes a while to import and set its title
while {"ray::DashboardAgent", "ray::RuntimeEnvAgent"} - set(names := process_names()) and time.monotonic() < deadline:
    time.sleep(0.5)
worker = ray.get(busy.remote())
time.sleep(1.5)  # the sampler sees the worker's title at least once more
background = upkeep.stop()
def cpu(process):
    times = process.cpu_times()
    return times.user + times.system
ray_processes = [p for p in psutil.Process().children(recursive=True) if "teibatch" not in " ".join(p.cmdline())]
print(" ".join(names))
print(background, cpu(psutil.Process(worker)), sum(cpu(p) for p in ray_processes))
ray.shutdown()
"""


def _python(script: str, env: dict[str, str]) -> list[str]:
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=170,
                          check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.splitlines()


@pytest.mark.timeout(180)
def test_a_private_ray_prestarts_no_worker_and_counts_its_background_without_the_runs_work() -> None:
    names, figures = _python(PRIVATE, plain_env())[-2:]
    # The GCS, the raylet and the two agents the raylet of Ray 2.60 always starts; no idle worker, no dashboard.
    assert names.split() == ["gcs_server", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "raylet"], names
    background, worker, everything = (float(figure) for figure in figures.split())
    assert background > 0 and worker >= 2.4
    # The task's worker is the run's: Ray's background is what the rest burned (sampled: a little behind).
    assert background <= everything - worker + 0.05, (background, worker, everything)


@pytest.mark.timeout(180)
def test_teibatch_ray_dashboard_brings_the_dashboard_back() -> None:
    script = """
import psutil, ray
from teibatch.pipeline.ray_runtime import start_local_ray
start_local_ray(num_cpus=1)
print(any("dashboard/dashboard.py" in " ".join(p.cmdline()) for p in psutil.Process().children(recursive=True)))
print(ray.get(ray.remote(lambda: 1).remote()))
ray.shutdown()
"""
    assert _python(script, {**plain_env(), "TEIBATCH_RAY_DASHBOARD": "1"})[-2:] == ["True", "1"]


@pytest.mark.timeout(300)
def test_a_joined_cluster_is_left_as_it_is_and_its_background_is_unknown(ambient_cluster: str) -> None:
    script = f"""
import psutil
from teibatch.pipeline.ray_runtime import ray_session
from teibatch.pipeline.summary import RunSummary
summary = RunSummary(run_id="joined")
with ray_session({ambient_cluster!r}, summary) as start:
    start.wait()
    started = " ".join(" ".join(p.cmdline()) for p in psutil.Process().children(recursive=True))
print(summary.ray_background, "gcs_server" in started or "raylet" in started)
"""
    # Unknown, and no Ray of the driver's own was started beside the cluster.
    assert _python(script, plain_env())[-1] == "None False"
