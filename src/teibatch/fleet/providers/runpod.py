"""Provider ``runpod``: the rented container *is* TEI — a RunPod GPU pod running the image for its card.

RunPod's REST API v2 (``https://api.runpod.io/v2``, ``Authorization: Bearer <key>``; the operations and
shapes of its OpenAPI file, ``api-reference-v2/openapi.json`` in RunPod's docs), the calls used:

* ``GET /v2/catalog/gpus?include=AVAILABILITY&product=POD&cloud=<cloud>&count=1`` (``listGpuTypes``): the
  cards, their list price per cloud (``price.secure`` / ``price.community``, USD per GPU-hour), whether
  the cloud has them (``secure`` / ``community``) and their pod stock now (``availability``: ``NONE``
  is none to rent)
* ``POST /v2/pods`` (``createPod``) with ``name`` (``teibatch-<run id>-<n>``), ``image`` (from
  ``configs/images.yaml`` by the card's compute capability), ``gpu: {id, count: 1}``, ``cloud``
  (``servers.cloud_type``: ``SECURE`` or ``COMMUNITY``), ``disk``, ``ports: ["80/tcp"]``, ``env:
  {"API_KEY": …}`` (TEI's ``--api-key``: the port is public), ``args`` (TEI's router arguments, given
  to the image's own entrypoint), ``dataCenterIds`` (``servers.regions``) and, with a network volume,
  ``mounts: {network: [{volumeId, path: /data}]}``; answers 201 with the Pod (``cost``: the rate it is
  billed at). A 400 is "this candidate could not be placed" (the spec: capacity and rule violations
  share it; try the next one), a 422 a body the API refuses (never retried)
* ``GET /v2/pods/{id}`` (``getPod``): ``status`` (``PROVISIONING``, ``STARTING``, ``RUNNING``, ``EXITED``,
  ``ERROR``, ``TERMINATED``) and ``runtime.ports`` (``{private: 80, public: <port>, ip}``)
* ``GET /v2/pods`` (``listPods``, not paginated): the account's pods, found again by the run's name
  prefix · ``DELETE /v2/pods/{id}`` (``deletePod``, 204; 404: already gone): terminate

Errors are ``application/problem+json`` (``title``, ``status``, ``detail``, ``errors``); unknown request
fields are refused by name. v2 has neither an interruptible (spot) option nor an entrypoint override:
``servers.capacity`` is ``on-demand`` only (the job file says so), and the image's own entrypoint runs
with our ``args``, so no deadline runs inside the pod. The run's deadline holds from the host side:
the driver terminates every pod of the run at its deadline and on teardown, and ``teibatch fleet
sweep`` terminates, from the ledger, what a driver that died left.

The key is ``$RUNPOD_API_KEY`` or ``api_key`` in ``~/.runpod/config.toml`` (what ``runpod config``
writes). ``$TEIBATCH_RUNPOD_API_URL`` replaces the API's address (tests, proxies). There is no shell on
the pod: the only export is a network volume, which teibatch never deletes; without one the job must
waive the export (the container disk goes with the pod).
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from teibatch.errors import CapacityUnavailable, FleetError
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.cloudapi import DEFAULT_API_TIMEOUT_S, ApiClient, api_url, key_value, read_api_key
from teibatch.fleet.containercloud import ContainerCloudProvider
from teibatch.fleet.images import CONTAINER_PORT
from teibatch.fleet.offers import Offer
from teibatch.fleet.rental import CloudApi, CloudInstance, CloudState

DEFAULT_API_URL = "https://api.runpod.io/v2"
API_URL_ENV = "TEIBATCH_RUNPOD_API_URL"
API_KEY_ENV = "RUNPOD_API_KEY"
API_KEY_FILE = Path("~/.runpod/config.toml")
CLOUDS = ("SECURE", "COMMUNITY")  # the v2 spec's Cloud enum (servers.cloud_type)
DEFAULT_CONTAINER_DISK_GB = 40
VOLUME_MOUNT = "/data"           # where TEI images keep the Hugging Face cache
_STATES = {"PROVISIONING": CloudState.PENDING, "STARTING": CloudState.PENDING, "RUNNING": CloudState.PENDING,
           "EXITED": CloudState.FAILED, "ERROR": CloudState.FAILED, "TERMINATED": CloudState.GONE}


def _classify(status: int, body: Any) -> type[FleetError]:
    """400 from RunPod: the candidate could not be placed (no capacity, as the spec says to read it)."""
    return CapacityUnavailable if status == 400 else FleetError


class RunPodApi(CloudApi):
    """RunPod's REST API v2 for the GPU catalog and pods, as much as renting needs."""

    name = "runpod"

    def __init__(self, *, cloud_type: str = "SECURE", base_url: str | None = None,
                 timeout: float = DEFAULT_API_TIMEOUT_S) -> None:
        if cloud_type not in CLOUDS:
            raise FleetError(f"runpod: cloud {cloud_type!r} is not one of {', '.join(CLOUDS)}")
        key = read_api_key("RunPod", API_KEY_ENV, [(API_KEY_FILE, key_value("api_key"))])
        self.cloud_type = cloud_type
        self.billing = billing_rules()["runpod"]
        self._client = ApiClient("runpod", base_url or api_url(API_URL_ENV, DEFAULT_API_URL), key,
                                 classify=_classify, timeout=timeout)

    def __repr__(self) -> str:
        return f"RunPodApi({self._client.base_url!r}, cloud={self.cloud_type!r})"

    def close(self) -> None:
        self._client.close()

    def offers(self) -> list[Offer]:
        """Every card of ``cloud_type`` with pods in stock now, at its list price there."""
        query = urlencode({"include": "AVAILABILITY", "product": "POD", "cloud": self.cloud_type, "count": 1})
        answer = self._client.call("GET", f"/catalog/gpus?{query}", what="list GPU types")
        cloud = self.cloud_type.lower()
        offers = []
        for gpu in answer.get("gpus") or []:
            price = (gpu.get("price") or {}).get(cloud)
            if not gpu.get(cloud) or gpu.get("availability") in (None, "NONE") or not price:
                continue  # not in this cloud, or none to rent now
            offers.append(Offer(cloud="runpod", key=str(gpu["id"]), gpu=str(gpu["id"]), vram_gb=int(gpu["memory"]),
                                price_per_hour=float(price)))
        return offers

    def create(self, body: Mapping[str, Any]) -> CloudInstance:
        """``POST /v2/pods``: the pod as the answer shows it (its ``price_per_hour`` is what it is billed at)."""
        pod = self._client.call("POST", "/pods", what=f"create pod {body['name']} on {body['gpu']['id']}",
                                json=dict(body))
        return self._instance(pod)

    @staticmethod
    def _instance(pod: Mapping[str, Any]) -> CloudInstance:
        status = str(pod.get("status", ""))
        state = _STATES.get(status, CloudState.UNKNOWN)
        ports, address = {}, None
        for port in (pod.get("runtime") or {}).get("ports") or []:
            if port.get("public") and port.get("ip") and port.get("private") is not None:
                ports[int(port["private"])] = int(port["public"])
                if int(port["private"]) == CONTAINER_PORT:
                    address = str(port["ip"])
        if state is CloudState.PENDING and status == "RUNNING" and address:
            state = CloudState.READY
        price = pod.get("cost")
        return CloudInstance(id=str(pod["id"]), name=str(pod.get("name") or ""), state=state, status=status,
                             address=address, ports=ports, price_per_hour=float(price) if price is not None else None)

    def get(self, instance_id: str) -> CloudInstance | None:
        pod = self._client.call("GET", f"/pods/{instance_id}", what="get pod", missing_ok=True)
        return self._instance(pod) if pod else None

    def list(self, prefix: str) -> list[CloudInstance]:
        """The account's pods named ``prefix…`` (``GET /v2/pods`` answers them all at once)."""
        answer = self._client.call("GET", "/pods", what="list pods")
        return [self._instance(p) for p in answer.get("pods") or [] if str(p.get("name") or "").startswith(prefix)
                and p.get("status") != "TERMINATED"]

    def terminate(self, instance_id: str) -> None:
        self._client.call("DELETE", f"/pods/{instance_id}", what=f"terminate pod {instance_id}", missing_ok=True)


class RunPodProvider(ContainerCloudProvider):
    """``count`` RunPod GPU pods, each the TEI image for its card, reached on the public port RunPod maps.

    Pods are the servers and hold nothing to export (the weights live in the network volume, kept,
    when the job names one), so ``down`` terminates them (:mod:`~teibatch.fleet.containercloud`).
    On-demand only: RunPod's API v2 rents no interruptible pods.
    """

    name = "runpod"
    noun = "pod"
    console = "RunPod's console"

    def __init__(self, api: RunPodApi, *, network_volume_id: str | None = None,
                 container_disk_gb: int = DEFAULT_CONTAINER_DISK_GB, **options: Any) -> None:
        super().__init__(api, **options)
        self.network_volume_id = network_volume_id
        self.container_disk_gb = container_disk_gb

    def ledger_config(self) -> dict[str, Any]:
        return {**super().ledger_config(), "network_volume_id": self.network_volume_id}

    def create(self, name: str, offer: Offer, deadline_s: int) -> str:
        assert isinstance(self.api, RunPodApi)
        pod = self.api.create(self.pod_request(name, offer))
        if pod.price_per_hour is not None and pod.price_per_hour != offer.price_per_hour and self._rental is not None:
            self._rental.note(name, None, price_per_hour=pod.price_per_hour)  # the cost line counts the billed rate
        return pod.id

    def pod_request(self, name: str, offer: Offer) -> dict[str, Any]:
        """The ``POST /v2/pods`` body for ``offer``: TEI's image for the card, its own entrypoint, our args.

        No deadline runs in the pod (v2 has no entrypoint override): the host side holds it
        (see the module docstring).
        """
        image, _ = self.router_command(offer, 0)
        body: dict[str, Any] = {
            "name": name, "image": image.image, "gpu": {"id": offer.key, "count": 1},
            "cloud": getattr(self.api, "cloud_type", "SECURE"), "disk": self.container_disk_gb,
            "ports": [f"{CONTAINER_PORT}/tcp"], "env": {"API_KEY": self.api_key},
            "args": shlex.join(self.router_args())}
        if self.want.regions:
            body["dataCenterIds"] = list(self.want.regions)
        if self.network_volume_id:
            body["mounts"] = {"network": [{"volumeId": self.network_volume_id, "path": VOLUME_MOUNT}]}
        return body
