"""A fake RunPod whose pods are real: each pod is a ``teibatch serve --api-key …`` process on 127.0.0.1.

Checked against RunPod's REST API reference (``docs.runpod.io/api-reference``, server
``https://rest.runpod.io/v1``; the field names as the ``runpod-sdk`` crate's ``PodCreateInput`` and ``Pod``
models give them) and, for prices, the ``runpod`` Python SDK's GraphQL (``runpod/api/queries/gpus.py``,
``runpod/api/graphql.py``: POST ``{"query", "variables"}`` to ``/graphql``, errors in ``errors[0].message``):

* ``POST /v1/pods`` with ``name``, ``imageName``, ``gpuTypeIds``, ``gpuCount``, ``cloudType``,
  ``containerDiskInGb``, ``volumeInGb``, ``volumeMountPath``, ``networkVolumeId``, ``ports``
  (``["80/tcp"]``), ``env`` (object), ``dockerEntrypoint``, ``dockerStartCmd``, ``dataCenterIds``,
  ``supportPublicIp``, ``interruptible`` → the Pod
* ``GET /v1/pods`` → ``[Pod...]`` · ``GET /v1/pods/{podId}`` → Pod or 404 · ``DELETE /v1/pods/{podId}``
* Pod: ``id``, ``name``, ``image``, ``desiredStatus`` (RUNNING, EXITED, TERMINATED), ``costPerHr``,
  ``gpu`` {id, count, displayName}, ``machine`` {gpuTypeId, dataCenterId}, ``publicIp``,
  ``portMappings`` ({"80": <public port>}), ``ports``, ``env``, ``networkVolumeId``, ``interruptible``
* GraphQL ``gpuTypes { id displayName memoryInGb securePrice communityPrice secureSpotPrice
  communitySpotPrice lowestPrice(input: $lowest) { minimumBidPrice uninterruptablePrice stockStatus } }``
  with ``$lowest: GpuLowestPriceInput!`` (the spot fields as RunPod's GraphQL spec,
  ``graphql-spec.runpod.io``, names them on ``GpuType`` and ``LowestPrice``)
* a spot pod (``interruptible: true``) is rented at the card's spot price for its ``cloudType``:
  ``costPerHr`` in the answer, ``interruptible: true`` on the Pod

Not verified against a live API (no network here): the body of a failed create. It is modelled as
``{"error": "create pod: There are no longer any instances available with the requested
specifications. Please refresh and try again.", "status": 500}`` (the message is the one RunPod's
GraphQL gives for an out-of-stock GPU).

The pod's container is the TEI image's command line run for real: ``dockerEntrypoint`` must be
``["timeout"]`` and ``dockerStartCmd`` ``[-k, <s>, <deadline>, text-embeddings-router, <router args>]``;
the fake runs ``timeout <deadline> python -m teibatch serve --api-key $API_KEY <router args>`` on a free
port and maps container port 80 to it. Faults: ``no_capacity`` (GPU type ids), ``no_spot`` (GPU type ids
with no spot pod to rent), ``spot_now`` (GPU type id → the spot price a create is charged, as when it
rose since the query), ``stuck`` (that many pods never start), ``slow_creates``/``create_delay_s``
(made, answered late); :meth:`FakeRunPod.preempt` interrupts a spot pod.
"""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path
from typing import Any

from tests.fleet.fakehttp import ContainerFake

GPU_TYPES = [
    {"id": "NVIDIA GeForce RTX 4090", "displayName": "RTX 4090", "memoryInGb": 24, "securePrice": 0.69,
     "communityPrice": 0.34, "secureSpotPrice": 0.35, "communitySpotPrice": 0.20, "stock": "High"},
    {"id": "NVIDIA RTX A6000", "displayName": "RTX A6000", "memoryInGb": 48, "securePrice": 0.76,
     "communityPrice": 0.49, "secureSpotPrice": 0.39, "communitySpotPrice": 0.25, "stock": "Medium"},
    {"id": "Tesla V100-SXM2-16GB", "displayName": "V100 SXM2", "memoryInGb": 16, "securePrice": 0.39,
     "communityPrice": 0.19, "secureSpotPrice": 0.20, "communitySpotPrice": 0.10, "stock": "High"},
    {"id": "NVIDIA H100 80GB HBM3", "displayName": "H100 SXM", "memoryInGb": 80, "securePrice": 2.99,
     "communityPrice": 2.69, "secureSpotPrice": 1.59, "communitySpotPrice": 1.39, "stock": None},
]
NO_CAPACITY = ("create pod: There are no longer any instances available with the requested specifications. "
               "Please refresh and try again.")



class FakeRunPod(ContainerFake):
    """RunPod's pod API and GPU price query; ``creates`` and ``terminates`` record every pod made and ended."""

    def __init__(self, api_key: str, workdir: Path) -> None:
        super().__init__(api_key, workdir)
        self.pods: dict[str, dict[str, Any]] = {}
        self.creates: list[dict[str, Any]] = []
        self.create_attempts: list[str] = []          # GPU type ids; "<id> (spot)" for an interruptible pod
        self.terminates: list[str] = []
        self.no_capacity: set[str] = set()
        self.no_spot: set[str] = set()
        self.spot_now: dict[str, float] = {}
        self.stuck = 0
        self.slow_creates = 0
        self.create_delay_s = 0.0
        self.route("POST", "/graphql", self._graphql)
        self.route("POST", "/v1/pods", self._create)
        self.route("GET", "/v1/pods", self._list)
        self.route("GET", "/v1/pods/(?P<id>[^/]+)", self._get)
        self.route("DELETE", "/v1/pods/(?P<id>[^/]+)", self._delete)

    @property
    def rest_url(self) -> str:
        return f"{self.url}/v1"

    @property
    def graphql_url(self) -> str:
        return f"{self.url}/graphql"

    def alive(self) -> int:
        """Pods not terminated, and pod processes still running: both must end at 0."""
        with self.lock:
            pods = sum(1 for p in self.pods.values() if p["desiredStatus"] != "TERMINATED")
            return pods + self.running()

    def _graphql(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        text = body["query"]
        if "gpuTypes" not in text or "$lowest: GpuLowestPriceInput!" not in text:
            return 200, {"errors": [{"message": "Cannot query this in the fake"}]}
        assert body["variables"]["lowest"] == {"gpuCount": 1}
        prices = ("securePrice", "communityPrice", "secureSpotPrice", "communitySpotPrice")
        gpus = [{"id": g["id"], "displayName": g["displayName"], "memoryInGb": g["memoryInGb"],
                 **{field: g[field] for field in prices if field in text},
                 "lowestPrice": {"minimumBidPrice": g["communitySpotPrice"],
                                 "uninterruptablePrice": g["communityPrice"], "stockStatus": g["stock"]}}
                for g in GPU_TYPES]
        return 200, {"data": {"gpuTypes": gpus}}

    def preempt(self, pod_id: str) -> None:
        """A spot pod interrupted: RunPod stops it (``desiredStatus`` ``EXITED``) and its container with it."""
        with self.lock:
            self.pods[pod_id]["desiredStatus"] = "EXITED"
        self.kill(pod_id)

    def serving(self) -> list[str]:
        """Pods running their container now, oldest first."""
        with self.lock:
            return [i for i, pod in self.pods.items() if pod["desiredStatus"] == "RUNNING"
                    and self.processes.get(i) is not None and self.processes[i].poll() is None]

    def _create(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        known = {"name", "imageName", "gpuTypeIds", "gpuCount", "cloudType", "containerDiskInGb", "volumeInGb",
                 "volumeMountPath", "networkVolumeId", "ports", "env", "dockerEntrypoint", "dockerStartCmd",
                 "dataCenterIds", "supportPublicIp", "interruptible"}
        assert set(body) <= known, set(body) - known
        gpu_id = body["gpuTypeIds"][0]
        spot = bool(body.get("interruptible"))
        with self.lock:
            self.create_attempts.append(f"{gpu_id} (spot)" if spot else gpu_id)
            if gpu_id in self.no_capacity or (spot and gpu_id in self.no_spot):
                return 500, {"error": NO_CAPACITY, "status": 500}
            gpu = next(g for g in GPU_TYPES if g["id"] == gpu_id)
            cloud = "community" if body["cloudType"] == "COMMUNITY" else "secure"
            price = (self.spot_now.get(gpu_id, gpu[f"{cloud}SpotPrice"]) if spot else gpu[f"{cloud}Price"])
            pod_id = secrets.token_hex(7)
            pod = {"id": pod_id, "name": body["name"], "image": body["imageName"], "desiredStatus": "RUNNING",
                   "costPerHr": str(price), "interruptible": spot,
                   "gpu": {"id": gpu_id, "count": 1, "displayName": gpu["displayName"]},
                   "machine": {"gpuTypeId": gpu_id, "dataCenterId": "EU-RO-1"}, "publicIp": None, "portMappings": None,
                   "ports": body["ports"], "env": body.get("env", {}), "networkVolumeId": body.get("networkVolumeId"),
                   "dockerEntrypoint": body["dockerEntrypoint"], "dockerStartCmd": body["dockerStartCmd"]}
            self.pods[pod_id] = pod
            self.creates.append(dict(body))
            if self.stuck > 0:
                self.stuck -= 1
            else:
                self._start(pod)
            slow = self.slow_creates > 0
            self.slow_creates -= 1 if slow else 0
        if slow:
            time.sleep(self.create_delay_s)
        return 200, self._public(pod)

    def _start(self, pod: dict[str, Any]) -> None:
        """Run the container: TEI's router command line, with the built-in server for the router."""
        assert pod["dockerEntrypoint"] == ["timeout"], pod["dockerEntrypoint"]
        port = self.run_router(pod["id"], pod["name"], list(pod["dockerStartCmd"]), pod["env"]["API_KEY"])
        pod.update(publicIp="127.0.0.1", portMappings={"80": port})

    @staticmethod
    def _public(pod: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in pod.items()}

    def _list(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            return 200, [self._public(p) for p in self.pods.values() if p["desiredStatus"] != "TERMINATED"]

    def _get(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            pod = self.pods.get(match["id"])
            if pod is None or pod["desiredStatus"] == "TERMINATED":
                return 404, {"error": "pod not found", "status": 404}
            return 200, self._public(pod)

    def _delete(self, match: re.Match[str], body: Any, query: Any) -> tuple[int, Any]:
        with self.lock:
            pod = self.pods.get(match["id"])
            if pod is None or pod["desiredStatus"] == "TERMINATED":
                return 404, {"error": "pod not found", "status": 404}
            pod["desiredStatus"] = "TERMINATED"
            self.terminates.append(pod["id"])
        self.kill(pod["id"])
        return 200, None
