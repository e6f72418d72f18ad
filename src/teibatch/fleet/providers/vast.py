"""Provider ``vast``: a container rented on Vast.ai's marketplace *is* TEI, on-demand or interruptible.

Vast.ai's REST API (``https://console.vast.ai/api/v0``, ``Authorization: Bearer <key>``), the calls
used, with the shapes of its API reference (``docs.vast.ai/api-reference``: search offers, create
instance, show instance(s), destroy instance) and of the ``vast-ai/vast-python`` CLI (``vast.py``:
``search__offers``, ``create__instance``, ``show__instances``, ``destroy_instance``); the bodies and
queries keep to Vast's OpenAPI file (``api-reference/openapi.yaml``; the tests' fake checks each):

* ``POST /bundles/`` with a query ``{field: {op: value}}``: ``verified``, ``external``, ``rentable``,
  ``rented``, ``num_gpus == 1``, ``compute_cap >= 750`` (TEI's minimum, ×100), ``reliability2 >=``
  ``servers.min_reliability``, ``gpu_name in servers.gpu``, ``gpu_ram >= min_vram_gb`` (MB, as the CLI
  sends it), ``dph_total <= max_price`` (on-demand) or ``min_bid <= max_price`` (interruptible),
  ``type: ondemand | bid``, ``order`` (price, then reliability: the spec wants two sort entries),
  ``allocated_storage`` (the disk, priced in ``dph_total``),
  ``limit``: answers ``{"offers": [{id, gpu_name, num_gpus, gpu_ram (MB), compute_cap, dph_total,
  min_bid, reliability2, ...}]}``; each offer is one machine, rentable once
* ``PUT /asks/{offer id}/`` with ``client_id: "me"``, ``image`` (TEI's image for the offer's
  ``compute_cap``), ``label`` (``teibatch-<run id>-<n>``), ``disk``, ``env`` ``"-e API_KEY=… -p 80:80"``
  (Docker flags, :func:`docker_env`; TEI's ``--api-key``: the port is public), for an interruptible instance ``price``
  (the bid, $/hour), and the launch (the API reference's "launch modes"):

  - without an export, ``runtype: "args"`` (the image as is, no SSH), ``onstart: "timeout"`` (the
    entrypoint of an args launch, as the CLI's ``--entrypoint`` sends it) and ``args`` (the host-side
    deadline around the image's own ``/entrypoint.sh``, which sets up CUDA's compat libraries and then
    runs ``text-embeddings-router``);
  - with ``export.to`` or ``export.import_from``, ``runtype: "ssh_direct"`` (the spec's name for the
    CLI's ``--ssh --direct``: Vast's entrypoint replaces the image's and runs sshd, mapping the
    container's port 22 to a host port) and ``onstart`` (the shell line Vast's entrypoint runs: TEI's
    image entrypoint ``/entrypoint.sh`` started in the background under the same deadline,
    ``--huggingface-hub-cache`` naming the model directory; with ``import_from``, only once teibatch
    has seeded that directory, see :func:`onstart_line`);

  answers ``{"success": true, "new_contract": id}``; an offer already taken answers 404 or 410 with
  ``no_such_ask`` in its message
* ``POST /instances/{id}/ssh/`` with ``{"ssh_key": "<public key>"}`` (the CLI's ``attach ssh``): the
  key ``root`` logs in with; the direct connection is ``root@<public_ipaddr>`` on the host port of
  ``ports["22/tcp"]`` (the CLI's ``ssh-url``)
* ``GET /api/v1/instances?limit=25[&after_token=…][&select_filters={"id": {"eq": id}}]`` (the v0 list,
  ``GET /instances/``, is deprecated): ``{"instances": [{actual_status, intended_status, cur_state,
  label, image_runtype, public_ipaddr, ports: {"80/tcp": [{"HostIp", "HostPort"}], "22/tcp": [...]},
  dph_total}, ...], "next_token": …}``, 25 a page, followed until ``next_token`` is ``null``; the run's
  instances are found again by label, one instance by its id (v0's ``GET /instances/{id}/`` is not
  used: its spec gives ``ports`` as a list of numbers, without the host ports) · ``DELETE
  /instances/{id}/`` (404: already gone)
* an ``actual_status`` of ``exited``, ``stopped``, ``offline`` or ``unknown`` never becomes ``running``:
  such an instance is given back at once, not waited for until ``startup_timeout``
* a bid below the offer's minimum bid now (it rose since the search) answers ``invalid_price``: like
  an offer taken, the next offer is tried

The key is ``$VAST_API_KEY``, else the CLI's key file (``~/.config/vastai/vast_api_key``, or the
older ``~/.vast_api_key``). ``$TEIBATCH_VAST_API_URL`` replaces the API's address (tests, proxies).
An instance's disk goes with it: a job either exports the model directory over SSH before the
instance is destroyed (``export.to``; :class:`VastProvider` with a ``login``), or waives the export.
With ``export.import_from`` (and a ``login``) every instance, a replacement rented mid-run too, gets the
model directory from that export before TEI starts, so it downloads nothing.
"""

from __future__ import annotations

import json
import logging
import math
import posixpath
import re
import shlex
import time
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

from teibatch.endpoint import Endpoint
from teibatch.errors import CapacityUnavailable, ExportFailed, FleetError, JobSpecError, TeardownIncomplete
from teibatch.fleet.base import Capability, DestroysHosts, ExportsVolumes, InstanceState, LaunchSpec, LostServer
from teibatch.fleet.catalog import billing_rules, image_table
from teibatch.fleet.cloudapi import DEFAULT_API_TIMEOUT_S, ApiClient, Pace, api_url, message_of, read_api_key
from teibatch.fleet.containercloud import ContainerCloudProvider
from teibatch.fleet.export import export_volume, seed_volume
from teibatch.fleet.hosted import DEFAULT_EXPORT_TIMEOUT_S
from teibatch.fleet.images import CONTAINER_PORT, ImageChoice
from teibatch.fleet.ledger import Ledger
from teibatch.fleet.offers import Capacity, GpuWant, Offer
from teibatch.fleet.rental import CloudApi, CloudInstance, CloudState, Rented
from teibatch.fleet.shell import Shell, SshLogin, SshShell, redact, shell_from_record, wait_login

log = logging.getLogger(__name__)

DEFAULT_API_URL = "https://console.vast.ai/api/v0"
API_URL_ENV = "TEIBATCH_VAST_API_URL"
API_KEY_ENV = "VAST_API_KEY"
API_KEY_FILES = (Path("~/.config/vastai/vast_api_key"), Path("~/.vast_api_key"))
DEFAULT_MIN_RELIABILITY = 0.98
DEFAULT_DISK_GB = 40
BID_MARGIN = 0.10          # the bid: the offer's minimum bid plus 10 %, never over servers.max_price
SEARCH_LIMIT = 64
SSH_PORT = 22
SSH_RUNTYPE = "ssh_direct"   # an SSH launch with a direct connection (the spec's runtype enum; the CLI sends
                             # "ssh_direc ssh_proxy", which the enum does not hold)
SSH_USER = "root"                      # who Vast's SSH launch lets in with the attached key
DEFAULT_MODEL_DIR = "/data"            # TEI's --huggingface-hub-cache in its images (HUGGINGFACE_HUB_CACHE)
TEI_LOG = "/var/log/teibatch-tei.log"  # where TEI's output goes on an SSH instance (not in the model directory)
SEED_MARKER = ".teibatch-seeded-{name}"  # in the model directory: written once the seed is done, removed as TEI starts
#: onstart's wait for the seed: until the marker ($1) exists or $2 seconds passed; then the marker goes, TEI starts
SEED_WAIT = ('n=0; while [ ! -e "$1" ] && [ "$n" -lt "$2" ]; do sleep 1; n=$((n+1)); done; '
             'rm -f "$1"; shift 2; exec "$@"')
#: an offer gone (taken), or bid under its minimum bid now (invalid_price): either way, try the next offer
_TAKEN_WORDS = ("no_such_ask", "no longer available", "not available", "already rented", "invalid_price")
PAGE_LIMIT = 25            # GET /api/v1/instances: at most 25 a page
MAX_PAGES = 400            # 10,000 instances: a bound on following next_token
#: actual_status → state, when the contract is not released (cur_state "unloaded": gone)
_STATES: dict[str | None, CloudState] = {
    None: CloudState.PENDING, "loading": CloudState.PENDING, "created": CloudState.PENDING,
    "scheduling": CloudState.PENDING, "rebooting": CloudState.PENDING, "running": CloudState.PENDING,
    "exited": CloudState.FAILED, "stopped": CloudState.FAILED, "offline": CloudState.FAILED,
    "unknown": CloudState.FAILED}
#: Vast's per-endpoint rate limits, from its API spec: each operation's 429 answer reads "API requests too
#: frequent endpoint threshold=<n>"; n is read as the seconds between two calls of that endpoint (the
#: costly calls have the larger n: create 4.5, destroy 3.0, show 2.0, list 1.0). A 429 is waited out anyway.
#: The v1 instance list (which also reads one instance) documents no threshold: paced as v0's list was.
#: Its calls name the whole v1 address, hence the pattern that matches it from the start.
PACES = (Pace("PUT", "/asks/", 4.5), Pace("DELETE", "/instances/", 3.0), Pace("GET", r".*/api/v1/instances", 1.0))
#: the search types each servers.capacity asks for, in the order their offers are tried
SEARCH_TYPES: dict[str, tuple[str, ...]] = {"on-demand": ("ondemand",), "spot": ("bid",), "any": ("bid", "ondemand")}


def _classify(status: int, body: Any) -> type[FleetError]:
    text = message_of(body).lower()
    return CapacityUnavailable if any(word in text for word in _TAKEN_WORDS) else FleetError


def _whole_file(text: str) -> str | None:
    """The CLI's key files hold the key alone."""
    return text.strip() or None


def compute_capability(value: Any) -> str | None:
    """Vast's ``compute_cap`` (capability × 100: 890) as ``"8.9"``."""
    try:
        number = int(value)
    except (TypeError, ValueError):
        return None
    return f"{number // 100}.{number % 100 // 10}" if number > 0 else None


def public_key_of(key_file: str) -> str:
    """The OpenSSH public key beside the private key ``key_file`` (``<key_file>.pub``), for Vast to let in.

    Raises :class:`JobSpecError` naming ``servers.key_file`` when it cannot be read or is not a public key.
    """
    path = Path(key_file).expanduser()
    public = path.with_name(f"{path.name}.pub")
    why = ("provider vast attaches the public key of servers.key_file to each instance, read from "
           f"{public} (ssh-keygen -y -f {path} > {public} writes it)")
    try:
        text = public.read_text().strip()
    except OSError as exc:
        raise JobSpecError(f"servers.key_file: cannot read {public}: {exc.strerror}; {why}",
                           key="servers.key_file") from None
    if not text.startswith(("ssh-", "ecdsa-", "sk-")) or len(text.split()) < 2:
        raise JobSpecError(f"servers.key_file: {public} does not hold an OpenSSH public key; {why}",
                           key="servers.key_file")
    return text


def onstart_line(command: list[str], *, marker: str | None = None, wait_s: int = 0) -> str:
    """The ``onstart`` of an SSH launch: ``timeout`` with ``command`` (TEI's image entrypoint under its deadline) in
    the background, its output in :data:`TEI_LOG`.

    With a ``marker``, the router starts only once that file exists (teibatch writes it when the model
    directory is seeded) or ``wait_s`` seconds have passed: TEI must not begin a download the seed
    would make useless, and a seed that never comes costs only the download.
    """
    router = ["timeout", *command]
    if marker is not None:
        router = ["sh", "-c", SEED_WAIT, "seed-wait", marker, str(wait_s), *router]
    return f"nohup {shlex.join(router)} > {TEI_LOG} 2>&1 &"


def docker_env(env: Mapping[str, str]) -> str:
    """``env`` as the create call's ``env`` string (Docker flags, as the spec gives it): ``-e KEY=value`` for a
    variable, the key alone for a flag such as ``-p 80:80`` (the CLI's ``{"-p 80:80": "1"}``)."""
    return " ".join(key if key.startswith("-") else f"-e {key}={shlex.quote(value)}" for key, value in env.items())


def bid_for(min_bid: float, max_price: float | None) -> float:
    """What to bid on an offer whose minimum bid is ``min_bid``: a margin over it, at most ``max_price``.

    An offer whose minimum bid is over ``max_price`` keeps its minimum bid (the price cap refuses it).
    """
    if max_price is not None and min_bid > max_price:
        return min_bid
    bid = math.ceil(min_bid * (1 + BID_MARGIN) * 1000) / 1000
    return bid if max_price is None else min(bid, max_price)


class VastApi(CloudApi):
    """Vast.ai's REST API, as much of it as renting needs; ``want``, ``capacity`` and ``min_reliability``
    shape the offer search (the marketplace is too big to list whole)."""

    name = "vast"

    def __init__(self, *, base_url: str | None = None,
                 timeout: float = DEFAULT_API_TIMEOUT_S, want: GpuWant | None = None, capacity: Capacity = "on-demand",
                 min_reliability: float = DEFAULT_MIN_RELIABILITY, disk_gb: int = DEFAULT_DISK_GB) -> None:
        key = read_api_key("Vast.ai", API_KEY_ENV, [(path, _whole_file) for path in API_KEY_FILES])
        self.billing = billing_rules()["vast"]
        self.want = want or GpuWant()
        self.capacity = capacity
        self.min_reliability = min_reliability
        self.disk_gb = disk_gb
        self._client = ApiClient("vast", base_url or api_url(API_URL_ENV, DEFAULT_API_URL), key, classify=_classify,
                                 timeout=timeout, paces=PACES)
        self._v1 = re.sub(r"/v0$", "/v1", self._client.base_url)  # the instance list is v1's

    def __repr__(self) -> str:
        return f"VastApi({self._client.base_url!r}, capacity={self.capacity!r})"

    def close(self) -> None:
        self._client.close()

    def search_query(self, kind: str) -> dict[str, Any]:
        """The ``POST /bundles/`` body for search type ``kind`` (``ondemand`` or ``bid``)."""
        price_field = "min_bid" if kind == "bid" else "dph_total"
        query: dict[str, Any] = {
            "verified": {"eq": True}, "external": {"eq": False}, "rentable": {"eq": True}, "rented": {"eq": False},
            "num_gpus": {"eq": 1}, "compute_cap": {"gte": int(float(image_table().min_compute_capability) * 100)},
            "reliability2": {"gte": self.min_reliability}, "type": kind,
            "order": [[price_field, "asc"], ["reliability2", "desc"]],   # the spec: at least two sort entries
            "allocated_storage": self.disk_gb, "limit": SEARCH_LIMIT}
        if self.want.names:
            query["gpu_name"] = {"in": list(self.want.names)}
        if self.want.min_vram_gb is not None:
            query["gpu_ram"] = {"gte": self.want.min_vram_gb * 1000}
        if self.want.max_price is not None:
            query[price_field] = {"lte": self.want.max_price}
        return query

    def offers(self) -> list[Offer]:
        offers = []
        for kind in SEARCH_TYPES[self.capacity]:
            answer = self._client.call("POST", "/bundles/", what=f"search {kind} offers", json=self.search_query(kind))
            for row in answer.get("offers") or []:
                if int(row.get("num_gpus") or 0) != 1 or not row.get("gpu_name"):
                    continue  # one TEI server per card
                bid = kind == "bid"
                price = (bid_for(float(row["min_bid"]), self.want.max_price) if bid
                         else float(row["dph_total"]))
                offers.append(Offer(cloud="vast", key=str(row["id"]), gpu=str(row["gpu_name"]),
                                    vram_gb=round(float(row.get("gpu_ram") or 0) / 1024), price_per_hour=price,
                                    interruptible=bid, compute_capability=compute_capability(row.get("compute_cap")),
                                    family=str(row["gpu_name"])))
        return offers

    def create(self, offer: Offer, body: Mapping[str, Any]) -> str:
        """``PUT /asks/{offer}/`` with ``body`` (its ``env`` a mapping, sent as the spec's Docker-flag string)."""
        what = f"create {body['label']} from offer {offer.label}"
        sent = {**body, "env": docker_env(body["env"])} if isinstance(body.get("env"), Mapping) else dict(body)
        answer = self._client.call("PUT", f"/asks/{offer.key}/", what=what, json=sent)
        if not isinstance(answer, Mapping) or not answer.get("success") or answer.get("new_contract") is None:
            raise _classify(200, answer)(f"vast: {what}: {message_of(answer)}")
        return str(answer["new_contract"])

    @staticmethod
    def _instance(row: Mapping[str, Any]) -> CloudInstance:
        actual = row.get("actual_status")
        status = str(actual or "provisioning")
        ports = {}
        mapped = row.get("ports")
        if isinstance(mapped, Mapping):
            for private, bindings in mapped.items():
                number = str(private).partition("/")[0]
                if number.isdigit() and isinstance(bindings, list) and bindings:
                    ports[int(number)] = int(bindings[0]["HostPort"])
        # cur_state "unloaded": the contract is released (destroyed); a status not known here stays UNKNOWN
        state = CloudState.GONE if row.get("cur_state") == "unloaded" else _STATES.get(actual, CloudState.UNKNOWN)
        needed = {CONTAINER_PORT, SSH_PORT} if "ssh" in str(row.get("image_runtype") or "") else {CONTAINER_PORT}
        if (state is CloudState.PENDING and actual == "running" and row.get("intended_status") == "running"
                and row.get("public_ipaddr") and needed <= set(ports)):
            state = CloudState.READY
        price = row.get("dph_total")
        return CloudInstance(id=str(row["id"]), name=str(row.get("label") or ""), state=state, status=status,
                             address=row.get("public_ipaddr") or None, ports=ports,
                             price_per_hour=float(price) if price is not None else None)

    def get(self, instance_id: str) -> CloudInstance | None:
        """The instance, from the v1 list filtered by id (where the spec documents its port mappings);
        ``None`` once it is destroyed."""
        if not instance_id.isdigit():
            return None
        rows = self._rows({"id": {"eq": int(instance_id)}}, what=f"show instance {instance_id}")
        return self._instance(rows[0]) if rows else None

    def list(self, prefix: str) -> list[CloudInstance]:
        """The account's instances labelled ``prefix…``: every page of ``GET /api/v1/instances``."""
        found = [self._instance(row) for row in self._rows(None, what="show instances")
                 if str(row.get("label") or "").startswith(prefix)]
        return [i for i in found if i.state is not CloudState.GONE]

    def _rows(self, filters: Mapping[str, Any] | None, *, what: str) -> tuple[Mapping[str, Any], ...]:
        """Every page of ``GET /api/v1/instances`` (``select_filters``: ``filters``), ``next_token`` followed."""
        rows: tuple[Mapping[str, Any], ...] = ()
        token = None
        for _ in range(MAX_PAGES):
            query = {"limit": PAGE_LIMIT, **({"select_filters": json.dumps(filters)} if filters else {}),
                     **({"after_token": token} if token else {})}
            answer = self._client.call("GET", f"{self._v1}/instances?{urlencode(query)}", what=what)
            rows += tuple(row for row in answer.get("instances") or [] if isinstance(row, Mapping))
            token = answer.get("next_token")
            if not token:
                return rows
        raise FleetError(f"vast: {what}: more than {MAX_PAGES} pages of {PAGE_LIMIT}")

    def terminate(self, instance_id: str) -> None:
        self._client.call("DELETE", f"/instances/{instance_id}/", what=f"destroy instance {instance_id}",
                          missing_ok=True)

    def attach_key(self, instance_id: str, public_key: str) -> None:
        """Let ``public_key`` log in to the instance (as ``root``)."""
        self._client.call("POST", f"/instances/{instance_id}/ssh/", json={"ssh_key": public_key},
                          what=f"attach the SSH key to instance {instance_id}")


class VastProvider(ContainerCloudProvider, ExportsVolumes, DestroysHosts):
    """``count`` Vast.ai instances, each the TEI image for its card, reached on the host port Vast maps.

    ``capacity``: ``on-demand``; ``spot`` (interruptible: a bid, see :func:`bid_for`); or ``any``
    (interruptible offers first, on-demand ones after them when none fits or every one is taken).

    With a ``login`` (its ``key_file``'s public key, ``<key_file>.pub``, is attached to each instance;
    without a ``key_file``, the keys of the Vast account must let it in), instances are launched for SSH
    as well, and one serves only once that login works; ``down`` then leaves the instances that served
    running, ``export_volumes`` copies their ``model_dir`` off over SSH (verified by sha256), and
    ``destroy`` destroys those whose copy was verified (all, when the export is waived). With a login
    and the launch's ``import_from``, each instance's TEI waits for its ``model_dir`` to be seeded
    from that export (:func:`onstart_line`, :meth:`_seed`).
    """

    name = "vast"
    console = "Vast's console (cloud.vast.ai/instances)"

    def __init__(self, api: VastApi, *, disk_gb: int = DEFAULT_DISK_GB, login: SshLogin | None = None,
                 model_dir: str = DEFAULT_MODEL_DIR, **options: Any) -> None:
        super().__init__(api, **options)
        self.disk_gb = disk_gb
        self.login = login
        self.model_dir = model_dir
        self.public_key = public_key_of(login.key_file) if login is not None and login.key_file else None
        if login is not None:
            self.capabilities = self.capabilities | {Capability.EXPORT, Capability.DESTROY}
        self._shells: dict[str, Shell] = {}     # instances logged in to (those that served hold the model)
        self._volumes: dict[str, str] = {}      # name → the model directory on it
        self._exported: set[str] = set()        # names whose export verified
        self.import_from: str | None = None     # the launch's export.import_from, seeded into every instance

    def up(self, spec: LaunchSpec | None = None) -> list[Endpoint]:
        if spec is not None and spec.import_from and self._rental is None:
            if self.login is None:
                raise FleetError("vast: export.import_from is copied into each instance over SSH: the provider "
                                 "needs a login (servers.key_file)")
            self.import_from = spec.import_from
        return super().up(spec)

    def create(self, name: str, offer: Offer, deadline_s: int) -> str:
        assert isinstance(self.api, VastApi)
        return self.api.create(offer, self.instance_request(name, offer, deadline_s))

    def router_command(self, offer: Offer, deadline_s: int) -> tuple[ImageChoice, list[str]]:
        image, command = super().router_command(offer, deadline_s)
        if self.login is not None:  # the directory exported is the one TEI keeps the model in
            command[4:4] = ["--huggingface-hub-cache", self.model_dir]
        return image, command

    def instance_request(self, name: str, offer: Offer, deadline_s: int) -> dict[str, Any]:
        """The ``PUT /asks/{id}/`` body for ``offer``: TEI's image for its card, behind the host-side deadline
        (and reachable over SSH when the run exports)."""
        image, command = self.router_command(offer, deadline_s)
        body: dict[str, Any] = {
            "client_id": "me", "image": image.image, "label": name, "disk": self.disk_gb,
            "env": {"API_KEY": self.api_key, f"-p {CONTAINER_PORT}:{CONTAINER_PORT}": "1"}}
        if self.login is None:
            body.update(runtype="args", onstart="timeout", args=command)
        else:  # Vast's entrypoint runs sshd, then this line; the router must not hold it up
            marker = self._seed_marker(name) if self.import_from else None
            body.update(runtype=SSH_RUNTYPE, onstart=onstart_line(command, marker=marker,
                                                                  wait_s=math.ceil(self.startup_timeout)))
        if offer.interruptible:
            body["price"] = offer.price_per_hour
        return body

    def ledger_config(self) -> dict[str, Any]:
        config = super().ledger_config()
        if self.login is not None:
            config["model_dir"] = self.model_dir
        return config

    # -- SSH: an instance is waited for once its login works (and its model directory is seeded) -----------

    def _seed_marker(self, name: str) -> str:
        return posixpath.join(self.model_dir, SEED_MARKER.format(name=name))

    def _prepare(self, item: Rented, deadline: float) -> str | None:
        if self.login is None:
            return None
        assert isinstance(self.api, VastApi) and self._rental is not None
        seen = item.seen
        assert seen is not None and seen.address and item.id is not None
        shell = SshShell(replace(self.login, port=seen.ports[SSH_PORT]).target(seen.address, str(self.run_id)))
        shell.secrets.append(self.api_key)
        try:
            if self.public_key:
                self.api.attach_key(item.id, self.public_key)
            wait_login(shell, deadline)
        except FleetError as exc:
            return f"no SSH login to {shell.label} within servers.startup_timeout: {redact(str(exc), [self.api_key])}"
        self._shells[item.name] = shell
        self._volumes[item.name] = self.model_dir
        self._rental.note(item.name, None, shell=shell.record(), volume=self.model_dir)
        return self._seed(item.name, shell, deadline, marker=self._seed_marker(item.cloud_name or item.name)) \
            if self.import_from else None

    def _seed(self, name: str, shell: Shell, deadline: float, *, marker: str) -> str | None:
        """Copy ``import_from`` into the instance's model directory (verified), then let its TEI start (write
        ``marker``, the one its create call's ``onstart`` waits for: named after that call's instance).

        A seed that fails is logged and recorded (``import_error``) and TEI starts all the same: it
        downloads the model, as without an import. Only a marker that cannot be written gives the
        instance back (its TEI would wait out the whole ``startup_timeout``).
        """
        assert self._rental is not None and self.import_from is not None
        try:
            count = seed_volume(shell, self.import_from, self.model_dir,
                                timeout=max(1.0, deadline - time.monotonic()))
        except FleetError as exc:
            log.warning("%s: import from %s failed, TEI will download the model: %s", name, self.import_from, exc)
            self._rental.note(name, None, import_error=str(exc))
        else:
            log.info("%s: %d files imported from %s", name, count, self.import_from)
            self._rental.note(name, None, imported=self.import_from)
        try:
            shell.run(f"mkdir -p {shlex.quote(self.model_dir)} && touch {shlex.quote(marker)}",
                      what="let TEI start (seed marker)", timeout=max(1.0, deadline - time.monotonic()))
        except FleetError as exc:
            return f"could not write {marker} on {shell.label}, which TEI waits for: {exc}"
        return None

    def lost(self) -> list[LostServer]:
        found = super().lost()
        for server in found:  # a stopped instance cannot be reached any more: nothing to copy off it
            self._shells.pop(server.name, None)
        return found

    # -- down, export, destroy -----------------------------------------------------------------------------

    def _held(self) -> frozenset[str]:
        if self._rental is None:
            return frozenset()
        return frozenset(name for name in self._shells if not self._rental.rented[name].terminated)

    def export_volumes(self, to: str, *, storage_options: Mapping[str, object] | None = None,
                       timeout: float | None = None) -> list[str]:
        urls, failures = [], []
        for name in sorted(self._held()):
            url = f"{to.rstrip('/')}/{name}"
            if name not in self._exported:
                self._note(name, export={"url": url, "verified": False})
                try:
                    export_volume(self._shells[name], self._volumes[name], url,
                                  timeout=timeout or DEFAULT_EXPORT_TIMEOUT_S, storage_options=storage_options,
                                  about={"run_id": self.run_id or "", "instance": name})
                except ExportFailed as exc:
                    failures.append(str(exc))
                    self._note(name, error=str(exc))
                    continue
                self._exported.add(name)
                self._note(name, export={"url": url, "verified": True})
            urls.append(url)
        if failures:
            raise ExportFailed("; ".join(failures))
        return urls

    def destroy(self, *, waive_export: bool = False) -> list[str]:
        if self._rental is None:
            return []
        kept, problems = [], []
        for name in sorted(self._held()):
            if not (name in self._exported or waive_export):
                kept.append(name)
                self._note(name, kept="export not verified")
                continue
            try:
                self._rental.terminate(self._rental.rented[name])
            except FleetError as exc:
                problems.append(f"{name}: {exc}")
                self._note(name, error=str(exc), state=InstanceState.UNKNOWN)
                continue
            self._note(name, state=InstanceState.DESTROYED)
        self._release()
        if problems:
            raise TeardownIncomplete(f"run {self.run_id}: vast instances may still run: {'; '.join(problems)}; "
                                     f"`teibatch fleet sweep` retries, or destroy them in {self.console}")
        return kept

    def _note(self, name: str, *, state: InstanceState | None = None, **fields: Any) -> None:
        """Record a step of the export or destroy (a ledger that cannot be written is logged, not raised:
        what it would record is done)."""
        assert self._rental is not None
        try:
            self._rental.note(name, state, **fields)
        except FleetError as exc:
            log.error("%s: %s", name, exc)

    @classmethod
    def restore(cls, record: Mapping[str, Any], ledger: Ledger, api: Any) -> VastProvider:
        """The provider of a recorded run (for ``teibatch fleet sweep``): its instances as recorded, and
        those reached over SSH that still hold the model, to export before they are destroyed."""
        provider = super().restore(record, ledger, api)
        assert provider._rental is not None
        for name, entry in record.get("instances", {}).items():
            if "shell" in entry and entry.get("state") == InstanceState.HEALTHY.value:
                provider._shells[name] = shell_from_record(entry["shell"])
                provider._volumes[name] = str(entry.get("volume") or DEFAULT_MODEL_DIR)
                if (entry.get("export") or {}).get("verified"):
                    provider._exported.add(name)
        if provider._shells:
            provider.capabilities = provider.capabilities | {Capability.EXPORT, Capability.DESTROY}
        return provider
