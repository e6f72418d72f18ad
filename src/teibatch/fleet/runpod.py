"""Provider ``runpod``: the rented container *is* TEI — a RunPod GPU pod running the image for its card.

RunPod's APIs, the calls used (shapes from the REST API reference ``docs.runpod.io/api-reference``
and the ``runpod`` Python SDK's GraphQL queries, ``runpod/api/queries/gpus.py``):

* GraphQL ``gpuTypes { id displayName memoryInGb securePrice communityPrice lowestPrice(input: {gpuCount: 1})
  { uninterruptablePrice stockStatus } }``: the cards and their current prices (the REST API lists none)
* REST ``POST /pods`` with ``name`` (``teibatch-<run id>-<n>``), ``imageName`` (from ``configs/images.yaml``
  by the card's compute capability), ``gpuTypeIds``, ``gpuCount: 1``, ``cloudType``, ``ports: ["80/tcp"]``,
  ``env: {"API_KEY": …}`` (TEI's ``--api-key``; the port is public), ``dockerEntrypoint: ["timeout"]`` and
  ``dockerStartCmd`` (the host-side deadline around ``text-embeddings-router``), ``networkVolumeId`` and
  ``volumeMountPath: /data`` when the job keeps its weights in a network volume
* REST ``GET /pods/{id}``: ``desiredStatus``, ``publicIp`` and ``portMappings`` (``{"80": <public port>}``)
* REST ``GET /pods``: the account's pods (found again by name) · REST ``DELETE /pods/{id}``: terminate

The key is ``$RUNPOD_API_KEY`` or ``api_key`` in ``~/.runpod/config.toml`` (what ``runpod config``
writes). ``$TEIBATCH_RUNPOD_API_URL`` and ``$TEIBATCH_RUNPOD_GRAPHQL_URL`` replace the APIs' addresses
(tests, proxies). There is no shell on the pod: the only export is a network volume, which teibatch
never deletes; without one the job must waive the export (the container disk goes with the pod).
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, FleetError, TeardownIncomplete
from teibatch.fleet.base import Capability, Instance, InstanceState, LaunchSpec, Provider, wait_healthy
from teibatch.fleet.catalog import billing_rules, image_table
from teibatch.fleet.cloudapi import DEFAULT_API_TIMEOUT_S, ApiClient, api_url, key_value, message_of, read_api_key
from teibatch.fleet.hosted import DEADLINE_MARGIN_S, DEFAULT_STARTUP_TIMEOUT_S, UNBOUNDED_RUNTIME_S
from teibatch.fleet.images import CONTAINER_PORT, KILL_AFTER_S, choose_image
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import GpuWant, Offer, choose_offers, gpu_info
from teibatch.fleet.rental import CloudApi, CloudInstance, CloudState, Rental, Rented

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://rest.runpod.io/v1"
DEFAULT_GRAPHQL_URL = "https://api.runpod.io/graphql"
API_URL_ENV = "TEIBATCH_RUNPOD_API_URL"
GRAPHQL_URL_ENV = "TEIBATCH_RUNPOD_GRAPHQL_URL"
API_KEY_ENV = "RUNPOD_API_KEY"
API_KEY_FILE = Path("~/.runpod/config.toml")
DEFAULT_CONTAINER_DISK_GB = 40
DEFAULT_MAX_REPLACEMENTS = 2
VOLUME_MOUNT = "/data"           # where TEI images keep the Hugging Face cache
_CAPACITY_WORDS = ("no longer any instances available", "no instances available", "not enough", "out of stock",
                   "insufficient capacity", "there are no")
_STATES = {"RUNNING": CloudState.PENDING, "CREATED": CloudState.PENDING, "RESTARTING": CloudState.PENDING,
           "EXITED": CloudState.FAILED, "DEAD": CloudState.FAILED, "TERMINATED": CloudState.GONE}
GPU_TYPES_QUERY = """query GpuTypes($lowest: GpuLowestPriceInput!) {
  gpuTypes {
    id
    displayName
    memoryInGb
    securePrice
    communityPrice
    lowestPrice(input: $lowest) { uninterruptablePrice stockStatus }
  }
}"""


def _classify(status: int, body: Any) -> type[FleetError]:
    text = message_of(body).lower()
    return CapacityUnavailable if any(word in text for word in _CAPACITY_WORDS) else FleetError


class RunPodApi(CloudApi):
    """RunPod's REST API for pods and its GraphQL API for GPU prices, as much as renting needs."""

    name = "runpod"

    def __init__(self, api_key: str | None = None, *, cloud_type: str = "SECURE", base_url: str | None = None,
                 graphql_url: str | None = None, timeout: float = DEFAULT_API_TIMEOUT_S) -> None:
        key = api_key or read_api_key("RunPod", API_KEY_ENV, [(API_KEY_FILE, key_value("api_key"))])
        self.cloud_type = cloud_type
        self.billing = billing_rules()["runpod"]
        self._rest = ApiClient("runpod", base_url or api_url(API_URL_ENV, DEFAULT_API_URL), key, classify=_classify,
                               timeout=timeout)
        self._graphql = ApiClient("runpod", graphql_url or api_url(GRAPHQL_URL_ENV, DEFAULT_GRAPHQL_URL), key,
                                  classify=_classify, timeout=timeout)

    def __repr__(self) -> str:
        return f"RunPodApi({self._rest.base_url!r})"

    def close(self) -> None:
        self._rest.close()
        self._graphql.close()

    def offers(self) -> list[Offer]:
        answer = self._graphql.call("POST", self._graphql.base_url, what="list GPU types",
                                    json={"query": GPU_TYPES_QUERY, "variables": {"lowest": {"gpuCount": 1}}})
        if answer.get("errors"):
            raise FleetError(f"runpod: list GPU types: {message_of(answer)}")
        offers = []
        for gpu in answer["data"]["gpuTypes"]:
            lowest = gpu.get("lowestPrice") or {}
            if not lowest.get("stockStatus"):
                continue  # none to rent now
            price = {"SECURE": gpu.get("securePrice"), "COMMUNITY": gpu.get("communityPrice")}.get(
                self.cloud_type, lowest.get("uninterruptablePrice"))
            if not price:
                continue
            offers.append(Offer(cloud="runpod", key=str(gpu["id"]), gpu=str(gpu["id"]), vram_gb=int(gpu["memoryInGb"]),
                                price_per_hour=float(price)))
        return offers

    def create(self, body: Mapping[str, Any]) -> str:
        pod = self._rest.call("POST", "/pods", what=f"create pod {body['name']} on {body['gpuTypeIds'][0]}",
                              json=dict(body))
        return str(pod["id"])

    @staticmethod
    def _instance(pod: Mapping[str, Any]) -> CloudInstance:
        status = str(pod.get("desiredStatus", ""))
        state = _STATES.get(status, CloudState.UNKNOWN)
        ports = {int(k): int(v) for k, v in (pod.get("portMappings") or {}).items()}
        if state is CloudState.PENDING and status == "RUNNING" and pod.get("publicIp") and CONTAINER_PORT in ports:
            state = CloudState.READY
        price = pod.get("costPerHr")
        return CloudInstance(id=str(pod["id"]), name=str(pod.get("name") or ""), state=state, status=status,
                             address=pod.get("publicIp") or None, ports=ports,
                             price_per_hour=float(price) if price is not None else None)

    def get(self, instance_id: str) -> CloudInstance | None:
        pod = self._rest.call("GET", f"/pods/{instance_id}", what="get pod", missing_ok=True)
        return self._instance(pod) if pod else None

    def list(self, prefix: str = "teibatch-") -> list[CloudInstance]:
        pods = self._rest.call("GET", "/pods", what="list pods")
        return [self._instance(p) for p in pods if str(p.get("name") or "").startswith(prefix)
                and p.get("desiredStatus") != "TERMINATED"]

    def terminate(self, instance_id: str) -> None:
        self._rest.call("DELETE", f"/pods/{instance_id}", what=f"terminate pod {instance_id}", missing_ok=True)


class RunPodProvider(Provider):
    """``count`` RunPod GPU pods, each the TEI image for its card, reached on the public port RunPod maps.

    Pods are the servers and hold nothing to export (the weights live in the network volume, kept,
    when the job names one), so ``down`` terminates them. A pod not healthy within ``startup_timeout``
    is terminated and replaced, at most ``max_replacements`` times in all.
    """

    name = "runpod"
    capabilities = frozenset({Capability.LAUNCH, Capability.SWEEP})

    def __init__(self, api: RunPodApi, *, count: int, want: GpuWant, model_id: str | None, image: str | None = None,
                 server_args: tuple[str, ...] | list[str] = (), startup_timeout: float = DEFAULT_STARTUP_TIMEOUT_S,
                 max_replacements: int = DEFAULT_MAX_REPLACEMENTS, network_volume_id: str | None = None,
                 container_disk_gb: int = DEFAULT_CONTAINER_DISK_GB, payload_limit: int | None = None,
                 ledger: Ledger | None = None, deadline_margin: float = DEADLINE_MARGIN_S) -> None:
        self.api = api
        self.count = count
        self.want = want
        self.model_id = model_id
        self.image = image
        self.server_args = tuple(server_args)
        self.startup_timeout = startup_timeout
        self.max_replacements = max_replacements
        self.network_volume_id = network_volume_id
        self.container_disk_gb = container_disk_gb
        self.payload_limit = payload_limit
        self.ledger = ledger or Ledger()
        self.deadline_margin = deadline_margin
        self.api_key = secrets.token_urlsafe(32)
        self.run_id: str | None = None
        self._rental: Rental | None = None
        self._urls: dict[str, str] = {}

    def __repr__(self) -> str:
        return f"RunPodProvider(count={self.count}, run_id={self.run_id!r})"

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        spec = spec or LaunchSpec(run_id=datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ-") + secrets.token_hex(3))
        if self._rental is not None:
            if self.run_id == spec.run_id:
                return self._endpoints()
            raise FleetError(f"this runpod provider already serves run {self.run_id}")
        self.run_id = spec.run_id
        self.ledger.begin(spec.run_id, provider=self.name, job=spec.job_name, export_to=None,
                          config={"kind": "runpod", "model_id": self.model_id,
                                  "network_volume_id": self.network_volume_id})
        self._rental = rental = Rental(self.api, self.ledger, spec.run_id)
        choice = choose_offers(self.api.offers(), self.want, self.model_id, image=self.image)
        if not choice.usable:
            raise CapacityUnavailable(f"runpod: no GPU type this job can rent now: {choice.why_none()}")
        deadline_s = int((spec.max_runtime or UNBOUNDED_RUNTIME_S) + self.startup_timeout + self.deadline_margin)
        reasons = rental.fill(self.count, choice.usable,
                              lambda n, o: self.api.create(self.pod_request(n, o, deadline_s)),
                              lambda item: self._serve(item, item.started + self.startup_timeout),
                              startup_timeout=self.startup_timeout, max_replacements=self.max_replacements,
                              noun="pod")
        endpoints = self._endpoints()
        if not endpoints:
            raise CapacityUnavailable(f"runpod: no server became healthy: {'; '.join(reasons)}")
        if len(endpoints) < self.count:
            log.warning("runpod: going on with %d of %d servers: %s", len(endpoints), self.count, "; ".join(reasons))
        return endpoints

    def pod_request(self, name: str, offer: Offer, deadline_s: int) -> dict[str, Any]:
        """The ``POST /pods`` body for ``offer``: TEI's image for the card, behind the host-side deadline."""
        gpu = gpu_info(offer)
        assert gpu is not None  # choose_offers kept only known cards
        image = choose_image(gpu, override=self.image).image
        command = ["-k", f"{KILL_AFTER_S}s", f"{deadline_s}s", image_table().entrypoint]
        if self.model_id:
            command += ["--model-id", self.model_id]
        body: dict[str, Any] = {
            "name": name, "imageName": image, "gpuTypeIds": [offer.key], "gpuCount": 1,
            "cloudType": getattr(self.api, "cloud_type", "SECURE"), "containerDiskInGb": self.container_disk_gb,
            "volumeInGb": 0, "ports": [f"{CONTAINER_PORT}/tcp"], "supportPublicIp": True, "interruptible": False,
            "env": {"API_KEY": self.api_key}, "dockerEntrypoint": ["timeout"],
            "dockerStartCmd": [*command, *self.server_args]}
        if self.want.regions:
            body["dataCenterIds"] = list(self.want.regions)
        if self.network_volume_id:
            body.update(networkVolumeId=self.network_volume_id, volumeMountPath=VOLUME_MOUNT)
        return body

    def _serve(self, item: Rented, deadline: float) -> bool:
        assert self._rental is not None
        seen = item.seen
        if seen is not None and seen.state is CloudState.READY and seen.address:
            url = f"http://{seen.address}:{seen.ports[CONTAINER_PORT]}"
            self._rental.note(item.name, InstanceState.RUNNING, host=f"{seen.address}:{seen.ports[CONTAINER_PORT]}")
            if wait_healthy(url, deadline):
                self._urls[item.name] = url
                self._rental.note(item.name, InstanceState.HEALTHY)
                return True
            item.error = (f"TEI did not answer /health on {url} within servers.startup_timeout "
                          f"({self.startup_timeout:.0f}s)")
        else:
            status = seen.status if seen else "unknown"
            item.error = f"not running within servers.startup_timeout ({self.startup_timeout:.0f}s; status {status})"
        try:
            self._rental.terminate(item)
        except FleetError as exc:
            self._rental.note(item.name, InstanceState.UNKNOWN, error=f"{item.error}; terminate: {exc}")
            return False
        self._rental.note(item.name, InstanceState.DESTROYED, error=item.error)
        return False

    def _endpoints(self) -> list[Endpoint]:
        return [Endpoint(url, self.api_key, self.payload_limit) for url in self._urls.values()]

    def down(self) -> None:
        """Terminate every pod of the run (also those found only by name); bounded, idempotent."""
        if self._rental is None:
            return
        self._urls.clear()
        problems = self._rental.terminate_all()
        try:
            self.ledger.release(self._rental.run_id)
        except FleetError as exc:
            log.error("%s", exc)
        if problems:
            raise TeardownIncomplete(f"run {self.run_id}: runpod pods may still run: {'; '.join(problems)}. They stop "
                                     "serving at their deadline but cost money until terminated: run "
                                     "`teibatch fleet sweep`, or terminate them in RunPod's console")

    def instances(self) -> list[Instance]:
        if self._rental is None:
            return []
        listed = []
        for item in self._rental.rented.values():
            state = (InstanceState.DESTROYED if item.terminated else InstanceState.HEALTHY if item.name in self._urls
                     else InstanceState.UNKNOWN)
            listed.append(Instance(provider=self.name, id=item.name, run_id=self.run_id or "", state=state,
                                   host=item.seen.address if item.seen else None, url=self._urls.get(item.name),
                                   details={"cloud_id": item.id or "",
                                            "offer": item.offer.label if item.offer else ""}))
        return listed

    @classmethod
    def restore(cls, record: Mapping[str, Any], ledger: Ledger, api: RunPodApi) -> RunPodProvider:
        """The provider of a recorded run (for ``teibatch fleet sweep``): its pods as recorded."""
        provider = cls(api, count=0, want=GpuWant(), model_id=None, ledger=ledger)
        provider.run_id = str(record["run_id"])
        provider._rental = rental = Rental(api, ledger, provider.run_id)
        for name, entry in record.get("instances", {}).items():
            rental.rented[name] = Rented(name, id=entry.get("cloud_id"),
                                         terminated=entry.get("state") == InstanceState.DESTROYED.value)
        return provider
