"""Provider ``runpod``: the rented container *is* TEI — a RunPod GPU pod running the image for its card.

RunPod's APIs, the calls used (shapes from the REST API reference ``docs.runpod.io/api-reference``
and the ``runpod`` Python SDK's GraphQL queries, ``runpod/api/queries/gpus.py``):

* GraphQL ``gpuTypes { id displayName memoryInGb securePrice communityPrice secureSpotPrice
  communitySpotPrice lowestPrice(input: {gpuCount: 1}) { minimumBidPrice uninterruptablePrice stockStatus } }``:
  the cards and their current prices, on-demand and spot (the REST API lists none)
* REST ``POST /pods`` with ``name`` (``teibatch-<run id>-<n>``), ``imageName`` (from ``configs/images.yaml``
  by the card's compute capability), ``gpuTypeIds``, ``gpuCount: 1``, ``cloudType``, ``ports: ["80/tcp"]``,
  ``env: {"API_KEY": …}`` (TEI's ``--api-key``; the port is public), ``dockerEntrypoint: ["timeout"]`` and
  ``dockerStartCmd`` (the host-side deadline around ``text-embeddings-router``), ``interruptible`` (``true``:
  a spot pod), ``networkVolumeId`` and ``volumeMountPath: /data`` when the job keeps its weights in a
  network volume; answers the Pod, its ``costPerHr`` the price it is rented at
* REST ``GET /pods/{id}``: ``desiredStatus``, ``publicIp`` and ``portMappings`` (``{"80": <public port>}``)
* REST ``GET /pods``: the account's pods (found again by name) · REST ``DELETE /pods/{id}``: terminate

**Spot pods.** ``servers.capacity: spot`` rents interruptible pods: ``POST /pods`` with ``interruptible:
true``, at the card's current spot price (``secureSpotPrice`` / ``communitySpotPrice`` by
``servers.cloud_type``; ``lowestPrice.minimumBidPrice`` for ``ALL``). RunPod's GraphQL mutation
``podRentInterruptable(input: PodRentInterruptableInput!)`` takes an explicit ``bidPerGpu`` (as SkyPilot's
``sky/provision/runpod/api/pods.py`` sends it), but its input sets the container's command only
(``dockerArgs``), not its entrypoint, so the host-side deadline could not be kept; the REST call takes no
bid. So ``max_price`` caps the bid in two places: a card whose spot price is over it is not tried, and a
pod whose ``costPerHr`` comes back over it (the price rose since the query) is terminated at once and
the next offer tried. ``any`` tries every spot offer first, then on-demand ones; "no capacity" moves on.

The key is ``$RUNPOD_API_KEY`` or ``api_key`` in ``~/.runpod/config.toml`` (what ``runpod config``
writes). ``$TEIBATCH_RUNPOD_API_URL`` and ``$TEIBATCH_RUNPOD_GRAPHQL_URL`` replace the APIs' addresses
(tests, proxies). There is no shell on the pod: the only export is a network volume, which teibatch
never deletes; without one the job must waive the export (the container disk goes with the pod).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from teibatch.errors import CapacityUnavailable, FleetError
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.cloudapi import DEFAULT_API_TIMEOUT_S, ApiClient, api_url, key_value, message_of, read_api_key
from teibatch.fleet.containercloud import ContainerCloudProvider
from teibatch.fleet.images import CONTAINER_PORT
from teibatch.fleet.offers import Offer
from teibatch.fleet.rental import CloudApi, CloudInstance, CloudState

DEFAULT_API_URL = "https://rest.runpod.io/v1"
DEFAULT_GRAPHQL_URL = "https://api.runpod.io/graphql"
API_URL_ENV = "TEIBATCH_RUNPOD_API_URL"
GRAPHQL_URL_ENV = "TEIBATCH_RUNPOD_GRAPHQL_URL"
API_KEY_ENV = "RUNPOD_API_KEY"
API_KEY_FILE = Path("~/.runpod/config.toml")
DEFAULT_CONTAINER_DISK_GB = 40
VOLUME_MOUNT = "/data"           # where TEI images keep the Hugging Face cache
_CAPACITY_WORDS = ("no longer any instances available", "no instances available", "not enough", "out of stock",
                   "insufficient capacity", "there are no")
_STATES = {"RUNNING": CloudState.PENDING, "CREATED": CloudState.PENDING, "RESTARTING": CloudState.PENDING,
           "EXITED": CloudState.FAILED, "DEAD": CloudState.FAILED, "TERMINATED": CloudState.GONE}
#: servers.cloud_type → the gpuTypes fields of its on-demand and spot prices (ALL: lowestPrice's, either cloud)
_PRICE_FIELDS = {"SECURE": ("securePrice", "secureSpotPrice"), "COMMUNITY": ("communityPrice", "communitySpotPrice")}
GPU_TYPES_QUERY = """query GpuTypes($lowest: GpuLowestPriceInput!) {
  gpuTypes {
    id
    displayName
    memoryInGb
    securePrice
    communityPrice
    secureSpotPrice
    communitySpotPrice
    lowestPrice(input: $lowest) { minimumBidPrice uninterruptablePrice stockStatus }
  }
}"""


def _classify(status: int, body: Any) -> type[FleetError]:
    text = message_of(body).lower()
    return CapacityUnavailable if any(word in text for word in _CAPACITY_WORDS) else FleetError


class RunPodApi(CloudApi):
    """RunPod's REST API for pods and its GraphQL API for GPU prices, as much as renting needs."""

    name = "runpod"

    def __init__(self, *, cloud_type: str = "SECURE", base_url: str | None = None,
                 timeout: float = DEFAULT_API_TIMEOUT_S) -> None:
        key = read_api_key("RunPod", API_KEY_ENV, [(API_KEY_FILE, key_value("api_key"))])
        self.cloud_type = cloud_type
        self.billing = billing_rules()["runpod"]
        self._rest = ApiClient("runpod", base_url or api_url(API_URL_ENV, DEFAULT_API_URL), key, classify=_classify,
                               timeout=timeout)
        self._graphql = ApiClient("runpod", api_url(GRAPHQL_URL_ENV, DEFAULT_GRAPHQL_URL), key,
                                  classify=_classify, timeout=timeout)

    def __repr__(self) -> str:
        return f"RunPodApi({self._rest.base_url!r})"

    def close(self) -> None:
        self._rest.close()
        self._graphql.close()

    def offers(self) -> list[Offer]:
        """Every card in stock, at most twice: on-demand, and spot where RunPod gives a spot price for it."""
        answer = self._graphql.call("POST", self._graphql.base_url, what="list GPU types",
                                    json={"query": GPU_TYPES_QUERY, "variables": {"lowest": {"gpuCount": 1}}})
        if answer.get("errors"):
            raise FleetError(f"runpod: list GPU types: {message_of(answer)}")
        offers = []
        on_demand_field, spot_field = _PRICE_FIELDS.get(self.cloud_type, (None, None))
        for gpu in answer["data"]["gpuTypes"]:
            lowest = gpu.get("lowestPrice") or {}
            if not lowest.get("stockStatus"):
                continue  # none to rent now
            prices = {False: gpu.get(on_demand_field) if on_demand_field else lowest.get("uninterruptablePrice"),
                      True: gpu.get(spot_field) if spot_field else lowest.get("minimumBidPrice")}
            offers += [Offer(cloud="runpod", key=str(gpu["id"]), gpu=str(gpu["id"]), vram_gb=int(gpu["memoryInGb"]),
                             price_per_hour=float(price), interruptible=interruptible)
                       for interruptible, price in prices.items() if price]
        return offers

    def create(self, body: Mapping[str, Any]) -> CloudInstance:
        """``POST /pods``: the pod as the answer shows it (its ``price_per_hour`` is what it is rented at)."""
        pod = self._rest.call("POST", "/pods", what=f"create pod {body['name']} on {body['gpuTypeIds'][0]}",
                              json=dict(body))
        return self._instance(pod)

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

    def list(self, prefix: str) -> list[CloudInstance]:
        pods = self._rest.call("GET", "/pods", what="list pods")
        return [self._instance(p) for p in pods if str(p.get("name") or "").startswith(prefix)
                and p.get("desiredStatus") != "TERMINATED"]

    def terminate(self, instance_id: str) -> None:
        self._rest.call("DELETE", f"/pods/{instance_id}", what=f"terminate pod {instance_id}", missing_ok=True)


class RunPodProvider(ContainerCloudProvider):
    """``count`` RunPod GPU pods, each the TEI image for its card, reached on the public port RunPod maps.

    Pods are the servers and hold nothing to export (the weights live in the network volume, kept,
    when the job names one), so ``down`` terminates them (:mod:`~teibatch.fleet.containercloud`).
    ``capacity``: ``on-demand``; ``spot`` (interruptible pods, at most ``max_price``); or ``any`` (spot
    offers first, on-demand ones after them when no spot pod can be had).
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
        pod = self.api.create(self.pod_request(name, offer, deadline_s))
        cap, price = self.want.max_price, pod.price_per_hour
        if offer.interruptible and cap is not None and price is not None and price > cap:
            # no bid on the REST call: a spot price that rose over the cap since the query is refused here
            try:
                self.api.terminate(pod.id)
            except FleetError as exc:
                raise FleetError(f"runpod: spot pod {name} ({pod.id}) came at ${price:.3f}/h, over servers.max_price "
                                 f"(${cap:.3f}), and could not be terminated: {exc}; teardown terminates it") from exc
            raise CapacityUnavailable(f"runpod: the spot price of {offer.gpu} is ${price:.3f}/h now, over "
                                      f"servers.max_price (${cap:.3f}): pod {pod.id} terminated")
        if price is not None and price != offer.price_per_hour and self._rental is not None:
            self._rental.note(name, None, price_per_hour=price)   # the cost line counts what the pod is rented at
        return pod.id

    def pod_request(self, name: str, offer: Offer, deadline_s: int) -> dict[str, Any]:
        """The ``POST /pods`` body for ``offer``: TEI's image for the card, behind the host-side deadline."""
        image, command = self.router_command(offer, deadline_s)
        body: dict[str, Any] = {
            "name": name, "imageName": image.image, "gpuTypeIds": [offer.key], "gpuCount": 1,
            "cloudType": getattr(self.api, "cloud_type", "SECURE"), "containerDiskInGb": self.container_disk_gb,
            "volumeInGb": 0, "ports": [f"{CONTAINER_PORT}/tcp"], "supportPublicIp": True,
            "interruptible": offer.interruptible,
            "env": {"API_KEY": self.api_key}, "dockerEntrypoint": ["timeout"], "dockerStartCmd": command}
        if self.want.regions:
            body["dataCenterIds"] = list(self.want.regions)
        if self.network_volume_id:
            body.update(networkVolumeId=self.network_volume_id, volumeMountPath=VOLUME_MOUNT)
        return body
