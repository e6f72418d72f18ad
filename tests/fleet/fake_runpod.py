"""A fake RunPod (REST API v2) whose pods are real: each pod is a ``teibatch serve --api-key …`` process.

Every request is checked against RunPod's own OpenAPI file (``../shared/clouds/runpod-v2-openapi.json``,
:mod:`tests.fleet.cloudspec`) before it is served, and refused as RunPod refuses it: 422
``application/problem+json`` whose ``errors`` name each field (an unknown field, a wrong enum such as
``cloud: "ALL"``, a missing required one); a route the spec lacks (v1's ``/v1/pods``) is 404. Every
answer is checked against the spec's response schema (``answer_problems``, asserted empty by the
fixture). The operations served, by the spec's names:

* ``listGpuTypes`` ``GET /v2/catalog/gpus`` (``include=AVAILABILITY`` needs ``product``, as documented: 400)
* ``createPod`` ``POST /v2/pods`` → 201 Pod (status ``PROVISIONING``); 400 problem+json when the card has
  no capacity (``no_capacity``; the ``detail`` is RunPod's GraphQL message for an out-of-stock GPU)
* ``listPods`` ``GET /v2/pods`` → ``{"pods": [...]}`` (not paginated in the spec) · ``getPod`` ``GET
  /v2/pods/{id}`` · ``deletePod`` ``DELETE /v2/pods/{id}`` → 204 · ``podAction`` ``POST
  /v2/pods/{id}/action`` (``stop``, ``start``, ``terminate``, ``restart``; 409 when the status forbids it)

A pod's container runs the image's own entrypoint with the pod's ``args`` (split as a shell would): the
fake runs ``python -m teibatch serve --api-key $API_KEY <args>`` on a free port and maps container
port 80 to it in ``runtime.ports``. It goes ``PROVISIONING`` → ``RUNNING`` on the next look at it.
Documented behaviour, made visible: ``rate_limit`` (429 with ``Retry-After``, problem+json; RunPod's
documented policy is per minute, ``RateLimit-Policy: "minute";q=60;w=60``), ``late_polls`` (a new pod
is left out of ``listPods`` for that many lists after the create answered). Faults: ``no_capacity``
(GPU type ids), ``stuck`` (that many pods never start), ``slow_creates``/``create_delay_s`` (made,
answered late); :meth:`FakeRunPod.stop_pod` stops a pod as RunPod's ``stop`` does.
"""

from __future__ import annotations

import re
import secrets
import shlex
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tests.fleet.cloudspec import OpenApiSpec
from tests.fleet.fakehttp import ContainerFake

SPEC_FILE = "runpod-v2-openapi.json"
GPU_TYPES = [
    {"id": "NVIDIA GeForce RTX 4090", "name": "RTX 4090", "memory": 24, "secure": 0.69, "community": 0.34,
     "availability": "HIGH"},
    {"id": "NVIDIA RTX A6000", "name": "RTX A6000", "memory": 48, "secure": 0.76, "community": 0.49,
     "availability": "MEDIUM"},
    {"id": "Tesla V100-SXM2-16GB", "name": "V100 SXM2", "memory": 16, "secure": 0.39, "community": 0.19,
     "availability": "HIGH"},
    {"id": "NVIDIA H100 80GB HBM3", "name": "H100 SXM", "memory": 80, "secure": 2.99, "community": 2.69,
     "availability": "NONE"},
]
NO_CAPACITY = ("There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")
_ACTIONS = {"PROVISIONING": ["stop", "terminate"], "STARTING": ["stop", "terminate"],
            "RUNNING": ["stop", "restart", "terminate"], "EXITED": ["start", "terminate"],
            "ERROR": ["start", "terminate"], "TERMINATED": []}


def problem(status: int, title: str, detail: str, errors: list[str] | None = None) -> tuple[int, Any]:
    """RunPod's error answer (``application/problem+json``)."""
    return status, {"title": title, "status": status, "detail": detail, **({"errors": errors} if errors else {})}


class FakeRunPod(ContainerFake):
    """RunPod's v2 pods and GPU catalog; ``creates`` and ``terminates`` record every pod made and ended."""

    def __init__(self, api_key: str, workdir: Path, spec: OpenApiSpec) -> None:
        super().__init__(api_key, workdir)
        self.spec = spec
        self.pods: dict[str, dict[str, Any]] = {}
        self.creates: list[dict[str, Any]] = []
        self.create_attempts: list[str] = []          # GPU type ids
        self.terminates: list[str] = []
        self.no_capacity: set[str] = set()
        self.stuck = 0
        self.slow_creates = 0
        self.create_delay_s = 0.0
        self.late_polls = 0
        self._hidden: dict[str, int] = {}              # pod id → lists it is still left out of
        self.route("GET", "/v2/catalog/gpus", self._catalog)
        self.route("POST", "/v2/pods", self._create)
        self.route("GET", "/v2/pods", self._list)
        self.route("GET", "/v2/pods/(?P<id>[^/]+)", self._get)
        self.route("DELETE", "/v2/pods/(?P<id>[^/]+)", self._delete)
        self.route("POST", "/v2/pods/(?P<id>[^/]+)/action", self._action)

    @property
    def rest_url(self) -> str:
        return f"{self.url}/v2"

    # -- RunPod's answers to what it refuses ----------------------------------------------------------
    def unauthorized(self) -> tuple[int, Any]:
        return problem(401, "Unauthorized", "missing bearer token")

    def refusal_status(self, problems: list[str]) -> int:
        return 422  # "The body does not match the contract. `errors` lists each violation."

    def refuse(self, status: int, problems: list[str]) -> tuple[int, Any]:
        if status == 404:
            return problem(404, "Not Found", problems[0])
        return problem(status, "Unprocessable Entity", "Request validation failed.", problems)

    def too_many(self, retry_after: int) -> tuple[int, Any]:
        return problem(429, "Too Many Requests", "rate limit exceeded for the minute window")

    def server_error(self) -> tuple[int, Any]:
        return problem(503, "Service Unavailable", "the service is temporarily unavailable")

    def content_type(self, status: int) -> str:
        return "application/problem+json" if status >= 400 else "application/json"

    # -- state -----------------------------------------------------------------------------------------
    def alive(self) -> int:
        """Pods not terminated, and pod processes still running: both must end at 0."""
        with self.lock:
            pods = sum(1 for p in self.pods.values() if p["status"] != "TERMINATED")
            return pods + self.running()

    def serving(self) -> list[str]:
        """Pods running their container now, oldest first."""
        with self.lock:
            return [i for i, pod in self.pods.items() if pod["status"] == "RUNNING"
                    and self.processes.get(i) is not None and self.processes[i].poll() is None]

    def stop_pod(self, pod_id: str) -> None:
        """A pod stopped (``podAction stop``, or RunPod's host gone): ``EXITED``, its container with it."""
        with self.lock:
            self._set_status(self.pods[pod_id], "EXITED")
        self.kill(pod_id)

    @staticmethod
    def _set_status(pod: dict[str, Any], status: str) -> None:
        pod.update(status=status, actions=list(_ACTIONS[status]))
        if status != "RUNNING":
            pod.update(runtime=None, cost=0.0)

    # -- operations ------------------------------------------------------------------------------------
    def _catalog(self, match: re.Match[str], body: Any, query: dict[str, list[str]]) -> tuple[int, Any]:
        include = "AVAILABILITY" in ",".join(query.get("include", []))
        if include != bool(query.get("product")):
            return problem(400, "Bad Request", "product is required with include=AVAILABILITY, and valid only with it")
        gpus = []
        for g in GPU_TYPES:
            gpu = {"id": g["id"], "name": g["name"], "pool": None, "manufacturer": "NVIDIA", "memory": g["memory"],
                   "secure": True, "community": True, "price": {"secure": g["secure"], "community": g["community"]},
                   "maxCount": {"secure": 8, "community": 4}}
            if include:
                gpu["availability"] = g["availability"]
            gpus.append(gpu)
        return 200, {"gpus": gpus}

    def _create(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        gpu_id = body["gpu"]["id"]
        with self.lock:
            self.create_attempts.append(gpu_id)
            gpu = next((g for g in GPU_TYPES if g["id"] == gpu_id), None)
            if gpu is None:
                return problem(400, "Bad Request", f"unknown GPU type {gpu_id}")
            if gpu_id in self.no_capacity or gpu["availability"] == "NONE":
                return problem(400, "Bad Request", NO_CAPACITY)
            pod_id = secrets.token_hex(7)
            cloud = body.get("cloud", "SECURE")
            now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
            pod = {"id": pod_id, "name": body["name"], "image": body["image"], "args": body.get("args", ""),
                   "disk": body.get("disk", 50), "ports": body.get("ports", []), "env": body.get("env", {}),
                   "registry": None, "mounts": body.get("mounts", {}), "gpu": {"id": gpu_id, "count": 1},
                   "cloud": cloud, "dataCenterId": "EU-RO-1", "cudaVersion": "12.8",
                   "ssh": {"proxy": None, "direct": None}, "template": None, "cost": gpu[cloud.lower()],
                   "locked": False, "globalNetworking": {"enabled": False}, "runtime": None, "createdAt": now,
                   "startedAt": None, "status": "PROVISIONING", "actions": list(_ACTIONS["PROVISIONING"])}
            self.pods[pod_id] = pod
            self.creates.append(dict(body))
            self.bill_start(pod_id, body["name"])
            self._hidden[pod_id] = self.late_polls
            if self.stuck > 0:
                self.stuck -= 1
                pod["never_starts"] = True
            slow = self.slow_creates > 0
            self.slow_creates -= 1 if slow else 0
            answer = self._public(pod)
        if slow:
            time.sleep(self.create_delay_s)
        return 201, answer

    def _advance(self, pod: dict[str, Any]) -> None:
        """A provisioning pod's container starts when it is next looked at (unless ``stuck``)."""
        if pod["status"] != "PROVISIONING" or pod.get("never_starts"):
            return
        args = shlex.split(pod["args"])
        port = self.run_entrypoint(pod["id"], pod["name"], args, pod["env"]["API_KEY"])
        self._set_status(pod, "RUNNING")
        pod.update(startedAt=pod["createdAt"], cost=next(g[pod["cloud"].lower()] for g in GPU_TYPES
                                                         if g["id"] == pod["gpu"]["id"]),
                   runtime={"uptime": 0, "ports": [{"private": 80, "public": port, "type": "tcp",
                                                    "ip": "127.0.0.1"}]})

    @staticmethod
    def _public(pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pod.items() if k != "never_starts"}

    def _list(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            listed = []
            for pod_id, pod in self.pods.items():
                if self._hidden.get(pod_id, 0) > 0:
                    self._hidden[pod_id] -= 1  # not visible in lists yet
                    continue
                if pod["status"] != "TERMINATED":
                    self._advance(pod)
                    listed.append(self._public(pod))
            return 200, {"pods": listed}

    def _found(self, pod_id: str) -> dict[str, Any] | None:
        pod = self.pods.get(pod_id)
        return None if pod is None or pod["status"] == "TERMINATED" else pod

    def _get(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            pod = self._found(match["id"])
            if pod is None:
                return problem(404, "Not Found", "pod not found")
            self._advance(pod)
            return 200, self._public(pod)

    def _terminate(self, pod: dict[str, Any]) -> None:
        self._set_status(pod, "TERMINATED")
        self.terminates.append(pod["id"])
        self.bill_stop(pod["id"])

    def _delete(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            pod = self._found(match["id"])
            if pod is None:
                return problem(404, "Not Found", "pod not found")
            self._terminate(pod)
        self.kill(match["id"])
        return 204, None

    def _action(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        action = body["action"]
        with self.lock:
            pod = self._found(match["id"])
            if pod is None:
                return problem(404, "Not Found", "pod not found")
            if action not in pod["actions"]:
                return problem(409, "Conflict", f"action {action} is not valid for a pod in status {pod['status']}")
            if action == "terminate":
                self._terminate(pod)
            elif action == "stop":
                self._set_status(pod, "EXITED")
            elif action == "start":
                self._set_status(pod, "PROVISIONING")
        if action in ("terminate", "stop", "restart"):
            self.kill(match["id"])
        with self.lock:
            if action == "restart":
                self._set_status(pod, "PROVISIONING")
                self._advance(pod)
            return (204, None) if action == "terminate" else (200, self._public(pod))
