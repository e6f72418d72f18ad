"""Provider ``lambda``: GPU VMs rented from Lambda Cloud's API, then served exactly like ``ssh`` hosts.

Lambda Cloud API v1 (``docs-api.lambda.ai/api/cloud``), the calls used:

* ``GET /instance-types``: every instance type, its ``price_cents_per_hour`` and the
  ``regions_with_capacity_available``; single-GPU types become :class:`~teibatch.fleet.offers.Offer`\\ s
* ``POST /instance-operations/launch`` with ``region_name``, ``instance_type_name``, ``ssh_key_names``,
  ``quantity: 1`` and ``name`` (``teibatch-<run id>-<n>``): answers ``{"data": {"instance_ids": [...]}}``
* ``GET /instances/{id}``: ``status`` booting → active (``ip`` set), or unhealthy, terminating, terminated
* ``GET /instances``: the account's running instances (found again by name)
* ``POST /instance-operations/terminate`` with ``instance_ids``

Requests are paced as Lambda documents its limits (:data:`PACES`): about one request a second, and one
launch every 10 seconds; a 429 is waited out as its ``Retry-After`` asks (:mod:`~teibatch.fleet.cloudapi`).

The key is ``$LAMBDA_API_KEY`` or ``api_key = …`` in ``~/.lambda_cloud/lambda_keys`` (the file
SkyPilot and Lambda's guides use). ``$TEIBATCH_LAMBDA_API_URL`` replaces the API's address (tests, proxies).

Once a VM is active it is a host of the ``ssh`` path (:class:`~teibatch.fleet.hosted.HostedServers`, which
the provider holds): probe → image for its card → ``docker run`` on its loopback with the per-run key and
the host-side deadline → SSH tunnel → ``/health``; its volume is exported over SSH; destroying it
terminates the VM.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, FleetError, TeardownIncomplete
from teibatch.fleet.base import InstanceState, LaunchSpec, new_run_id
from teibatch.fleet.catalog import billing_rules
from teibatch.fleet.cloudapi import DEFAULT_API_TIMEOUT_S, ApiClient, Pace, api_url, key_value, read_api_key
from teibatch.fleet.hosted import HostedProvider, HostedServer, HostedServers, HostPlan
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import GpuWant, Offer, choose_offers
from teibatch.fleet.rental import CloudApi, CloudInstance, CloudState, Rental, Rented
from teibatch.fleet.shell import SshLogin, SshShell, wait_login

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://cloud.lambdalabs.com/api/v1"
API_URL_ENV = "TEIBATCH_LAMBDA_API_URL"
API_KEY_ENV = "LAMBDA_API_KEY"
API_KEY_FILE = Path("~/.lambda_cloud/lambda_keys")
_CAPACITY_CODES = ("insufficient-capacity", "quota-exceeded")
#: Lambda's documented rate limits: about 1 request per second in all, and 1 launch per 10 seconds
PACES = (Pace("*", "", 1.0), Pace("POST", "/instance-operations/launch", 10.0))
_STATES = {"booting": CloudState.PENDING, "active": CloudState.READY, "unhealthy": CloudState.FAILED,
           "terminating": CloudState.GONE, "terminated": CloudState.GONE, "preempted": CloudState.GONE}


def _classify(status: int, body: Any) -> type[FleetError]:
    code = str((body.get("error") or {}).get("code", "")) if isinstance(body, Mapping) else ""
    return CapacityUnavailable if any(c in code for c in _CAPACITY_CODES) else FleetError


def gpu_count(kind: Mapping[str, Any]) -> int:
    """The GPUs of an instance type: ``specs.gpus``, else the count in its name (``gpu_8x_a100`` → 8), else 1.

    Some types come without ``specs.gpus``; reading 1 for them would rent an 8-GPU machine for one server.
    """
    gpus = (kind.get("specs") or {}).get("gpus")
    if gpus is not None:
        return int(gpus)
    match = re.match(r"gpu_(\d+)x_", str(kind.get("name", "")))
    return int(match.group(1)) if match else 1


def _vram_gb(text: str) -> int:
    match = re.search(r"(\d+)\s*GB", text)
    return int(match.group(1)) if match else 0


class LambdaApi(CloudApi):
    """Lambda Cloud's API, as much of it as renting needs."""

    name = "lambda"

    def __init__(self, *, base_url: str | None = None, timeout: float = DEFAULT_API_TIMEOUT_S) -> None:
        key = read_api_key("Lambda Cloud", API_KEY_ENV, [(API_KEY_FILE, key_value("api_key"))])
        self.billing = billing_rules()["lambda"]
        self._client = ApiClient("lambda", base_url or api_url(API_URL_ENV, DEFAULT_API_URL), key,
                                 classify=_classify, timeout=timeout, paces=PACES)

    def __repr__(self) -> str:
        return f"LambdaApi({self._client.base_url!r})"

    def close(self) -> None:
        self._client.close()

    def offers(self) -> list[Offer]:
        data = self._client.call("GET", "/instance-types", what="list instance types")["data"]
        offers = []
        for entry in data.values():
            kind = entry["instance_type"]
            if gpu_count(kind) != 1:
                continue  # one TEI server per card: single-GPU instance types only
            gpu = kind.get("gpu_description") or kind.get("description", "")
            for region in entry.get("regions_with_capacity_available", []):
                offers.append(Offer(cloud="lambda", key=kind["name"], gpu=gpu, vram_gb=_vram_gb(gpu),
                                    price_per_hour=int(kind["price_cents_per_hour"]) / 100, region=region["name"]))
        return offers

    def launch(self, name: str, offer: Offer, ssh_key_name: str) -> str:
        body = {"region_name": offer.region, "instance_type_name": offer.key, "ssh_key_names": [ssh_key_name],
                "quantity": 1, "name": name}
        data = self._client.call("POST", "/instance-operations/launch", what=f"launch {offer.label}", json=body)
        return str(data["data"]["instance_ids"][0])

    @staticmethod
    def _instance(data: Mapping[str, Any]) -> CloudInstance:
        status = str(data.get("status", ""))
        price = (data.get("instance_type") or {}).get("price_cents_per_hour")
        return CloudInstance(id=str(data["id"]), name=str(data.get("name") or ""),
                             state=_STATES.get(status, CloudState.UNKNOWN), status=status, address=data.get("ip"),
                             price_per_hour=int(price) / 100 if price is not None else None)

    def get(self, instance_id: str) -> CloudInstance | None:
        data = self._client.call("GET", f"/instances/{instance_id}", what="get instance", missing_ok=True)
        return self._instance(data["data"]) if data else None

    def list(self, prefix: str) -> list[CloudInstance]:
        data = self._client.call("GET", "/instances", what="list instances")["data"]
        return [self._instance(i) for i in data if str(i.get("name") or "").startswith(prefix)]

    def terminate(self, instance_id: str) -> None:
        self._client.call("POST", "/instance-operations/terminate", what=f"terminate {instance_id}",
                          json={"instance_ids": [instance_id]}, missing_ok=True)


class LambdaProvider(HostedProvider):
    """``count`` single-GPU VMs from Lambda Cloud, each serving TEI like an ``ssh`` host.

    A VM that is not active, not reachable or not healthy within ``startup_timeout`` is terminated and
    replaced, at most ``max_replacements`` times in all (default: ``count``); then the run goes on with
    fewer servers, or stops with :class:`CapacityUnavailable` naming why when none is healthy. The VMs
    are rented through a :class:`~teibatch.fleet.rental.Rental` and served by ``hosted`` (the ``ssh``
    path's :class:`~teibatch.fleet.hosted.HostedServers`, whose options ``options`` are), which
    terminates a VM to destroy its host.
    """

    name = "lambda"

    def __init__(self, api: LambdaApi, *, count: int, want: GpuWant, ssh_key_name: str, login: SshLogin,
                 max_replacements: int | None = None, ledger: Ledger | None = None,
                 **options: Any) -> None:
        self.hosted = HostedServers(name=self.name, gpu=True, ledger=ledger, destroy_host=self._terminate_host,
                                    **options)
        self.ledger = self.hosted.ledger
        self.api = api
        self.count = count
        self.want = want
        self.ssh_key_name = ssh_key_name
        self.login = login
        self.max_replacements = count if max_replacements is None else max_replacements
        self._rental: Rental | None = None

    def __repr__(self) -> str:
        return f"LambdaProvider(count={self.count}, run_id={self.hosted.run_id!r})"

    # -- up ------------------------------------------------------------------------------------------------

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        hosted = self.hosted
        spec = spec or LaunchSpec(run_id=new_run_id())
        if self._rental is not None:
            if hosted.run_id == spec.run_id:
                return hosted.endpoints()
            raise FleetError(f"this lambda provider already serves run {hosted.run_id}")
        hosted.begin(spec, {"kind": "lambda", "gpu": True, "remove_volume": hosted.remove_volume,
                            "model_id": hosted.model_id, "image": hosted.image, "ssh": asdict(self.login)})
        self._rental = rental = Rental(self.api, self.ledger, spec.run_id)
        choice = choose_offers(self.api.offers(), self.want, hosted.model_id, image=hosted.image)
        if not choice.usable:
            raise CapacityUnavailable(f"lambda: no instance type this job can rent now: {choice.why_none()}")
        reasons = rental.fill(self.count, choice.usable,
                              lambda name, offer: self.api.launch(name, offer, self.ssh_key_name),
                              lambda item: self._serve(item, spec, item.started + hosted.startup_timeout),
                              startup_timeout=hosted.startup_timeout, max_replacements=self.max_replacements)
        endpoints = hosted.endpoints()
        if not endpoints:
            raise CapacityUnavailable(f"lambda: no server became healthy: {'; '.join(reasons)}")
        if len(endpoints) < self.count:
            log.warning("lambda: going on with %d of %d servers: %s", len(endpoints), self.count, "; ".join(reasons))
        return endpoints

    def _serve(self, item: Rented, spec: LaunchSpec, deadline: float) -> bool:
        """Make an active VM serve TEI through the ``ssh`` path; give it back when it cannot."""
        hosted = self.hosted
        seen = item.seen
        if seen is None or seen.state is not CloudState.READY or not seen.address:
            status = seen.status if seen else "unknown"
            item.error = (f"not active within servers.startup_timeout ({hosted.startup_timeout:.0f}s; "
                          f"status {status})")
            self._give_back(item)
            return False
        shell = SshShell(self.login.target(seen.address, str(hosted.run_id)))
        server = hosted.add(item.name, HostPlan(shell))
        hosted.note(server, None, required=True, host=shell.label, shell=shell.record())
        # sshd starts a little after the API says active: wait until the VM takes a login
        hosted.attempt(server, lambda: wait_login(shell, deadline))
        if server.state is not InstanceState.FAILED:
            hosted.attempt(server, lambda: hosted.launch(server, spec, deadline))
        if server.state is InstanceState.RUNNING:
            hosted.attempt(server, lambda: hosted.reach(server, deadline))
        if server.state is InstanceState.HEALTHY:
            return True
        item.error = server.details.get("error", server.state.value)
        server.close_tunnel()
        self._give_back(item)
        server.state = InstanceState.DESTROYED
        return False

    def _give_back(self, item: Rented) -> None:
        """Terminate a VM that will not serve (its volume holds nothing the run needs)."""
        assert self._rental is not None
        failure = self._rental.give_back(item)
        if failure is not None:
            log.error("%s: %s (teardown tries again)", item.name, failure)

    # -- down, export, destroy -----------------------------------------------------------------------------

    def down(self) -> None:
        if self._rental is not None:
            for server in self.hosted.servers:  # a VM already gone has no container left to remove
                item = self._rental.rented.get(server.name)
                if item is None or item.id is None or server.state is InstanceState.DESTROYED:
                    continue
                try:
                    seen = self.api.get(item.id)
                except FleetError:
                    continue
                if seen is None or seen.state is CloudState.GONE:
                    item.terminated = True
                    self.hosted.note(server, InstanceState.DESTROYED)
        self.hosted.down()

    def _terminate_host(self, server: HostedServer) -> None:
        """Destroy ``server``'s host: terminate its VM (how ``hosted`` destroys a host here)."""
        assert self._rental is not None
        item = self._rental.rented.setdefault(server.name, Rented(server.name))
        self._rental.terminate(item)

    def destroy(self, *, waive_export: bool = False) -> list[str]:
        problems = []
        if self._rental is not None:  # VMs that serve no container any more (also those no create call answered for)
            served = {server.name for server in self.hosted.servers if server.state is not InstanceState.DESTROYED}
            problems = self._rental.terminate_all(keep=served)
        try:
            kept = self.hosted.destroy(waive_export=waive_export)
        except FleetError as exc:
            problems.append(str(exc))
            kept = []
        if problems:
            raise TeardownIncomplete(f"run {self.hosted.run_id}: lambda instances may still run: "
                                     f"{'; '.join(problems)}; `teibatch fleet sweep` retries")
        return kept

    @classmethod
    def restore(cls, record: Mapping[str, Any], ledger: Ledger, api: LambdaApi) -> LambdaProvider:
        """The provider of a recorded run (for ``teibatch fleet sweep``): its VMs and containers as recorded."""
        config = record.get("config", {})
        provider = cls(api, count=0, want=GpuWant(), ssh_key_name="", login=SshLogin(**config.get("ssh", {})),
                       remove_volume=bool(config.get("remove_volume", False)), ledger=ledger)
        provider.hosted.restore(record)
        provider._rental = Rental.from_record(api, ledger, record)
        return provider
